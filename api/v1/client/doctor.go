package client

import (
	"context"
	"net/http"

	"github.com/cellium/cellium/api/v1/models"
)

// GetDoctor asks the agent to check the node's invariants
// (GET /v1/doctor). The agent may take a few seconds: it looks twice
// before it reports a disagreement.
func (c *Client) GetDoctor(ctx context.Context) (*models.DoctorReport, error) {
	var r models.DoctorReport
	if err := c.Do(ctx, http.MethodGet, "/v1/doctor", nil, &r); err != nil {
		return nil, err
	}
	if r.Findings == nil {
		r.Findings = []models.DoctorFinding{}
	}
	return &r, nil
}
