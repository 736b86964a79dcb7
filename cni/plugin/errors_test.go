package plugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/cellium/cellium/api/v1/client"
	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/datapath/link"
)

func apiError(status int, msg string) error {
	return fmt.Errorf("op: %w", &client.APIError{Method: "PUT", Path: "/v1/endpoint", StatusCode: status,
		Payload: &models.Error{Code: status, Message: msg}})
}

func TestAgentErrorCodes(t *testing.T) {
	tests := []struct {
		name string
		err  error
		code uint
	}{
		{"unreachable", fmt.Errorf("%w: connect to /x.sock: no such file", client.ErrAgentUnreachable), types.ErrTryAgainLater},
		{"not ready", apiError(503, "IPAM not ready"), types.ErrTryAgainLater},
		{"rate limited", apiError(429, "too many requests"), types.ErrTryAgainLater},
		{"deadline", fmt.Errorf("agent API PUT /v1/endpoint: %w", context.DeadlineExceeded), types.ErrTryAgainLater},
		{"connection dropped", fmt.Errorf("agent API PUT /v1/endpoint: %w", io.ErrUnexpectedEOF), types.ErrTryAgainLater},
		{"refused", apiError(400, "bad request"), types.ErrInternal},
		{"conflict", apiError(409, "exists"), types.ErrInternal},
		{"failed", apiError(500, "regeneration failed"), types.ErrInternal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := agentError("create the endpoint", tt.err)
			if e.Code != tt.code {
				t.Fatalf("code %d (%v), want %d", e.Code, e, tt.code)
			}
			if isTransient(tt.err) != (tt.code == types.ErrTryAgainLater) {
				t.Fatalf("isTransient = %v", isTransient(tt.err))
			}
		})
	}
	// The agent's own message reaches the runtime.
	if e := agentError("allocate", apiError(500, "pool 10.0.0.0/24 exhausted")); !strings.Contains(e.Details, "pool 10.0.0.0/24 exhausted") {
		t.Errorf("details %q lack the agent's message", e.Details)
	}
	if agentError("x", nil) != nil {
		t.Error("agentError(nil) != nil")
	}
}

func TestLinkErrorCodes(t *testing.T) {
	tests := []struct {
		err  error
		code uint
	}{
		{fmt.Errorf("setup: %w: /var/run/netns/x", link.ErrNetnsNotFound), types.ErrInvalidNetNS},
		{fmt.Errorf("setup: %w: MTU 10", link.ErrInvalidSpec), types.ErrInvalidNetworkConfig},
		{errors.Join(fmt.Errorf("%w: pod link eth0", link.ErrLinkNotFound)), ErrCodeEndpointMismatch},
		{errors.Join(fmt.Errorf("%w: route missing", link.ErrMismatch)), ErrCodeEndpointMismatch},
		{fmt.Errorf("%w: lxc123 is a bridge", link.ErrHostLinkInUse), types.ErrInternal},
		{errors.New("netlink: operation not permitted"), types.ErrInternal},
	}
	for _, tt := range tests {
		if e := linkError("op", tt.err); e.Code != tt.code {
			t.Errorf("linkError(%v) code %d, want %d", tt.err, e.Code, tt.code)
		}
	}
	if linkError("x", nil) != nil {
		t.Error("linkError(nil) != nil")
	}
}

func TestWithRollback(t *testing.T) {
	e := newError(types.ErrInternal, "create the endpoint failed", "agent said no")
	if got := withRollback(e, nil); got != e {
		t.Errorf("withRollback(e, nil) changed e: %v", got)
	}
	got := withRollback(e, errors.New("remove interface: busy"))
	if got.Code != e.Code || got.Msg != e.Msg || got.Details != "agent said no; rollback incomplete: remove interface: busy" {
		t.Errorf("withRollback = %+v", got)
	}
}
