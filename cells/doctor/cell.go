package doctor

import (
	"context"
	"net/http"
	"time"

	"github.com/cellium/cellium/cells/agentapi"
	"github.com/cellium/cellium/cells/hive"
)

// Cell serves GET /v1/doctor.
var Cell = hive.Module("doctor", "Checks the endpoint invariants of the node (cellium doctor)",
	// --doctor-settle-time.
	hive.Config(DefaultConfig),
	// The doctor: reads tables, IPAM's list, the veths and the state files.
	hive.ProvidePrivate(New),
	// GET /v1/doctor on the agent API.
	hive.Provide(apiHandlers),
)

// maxRunTime bounds one check, settle time included, beyond which the
// request fails rather than hang the CLI.
const maxRunTime = time.Minute

func apiHandlers(d *Doctor) agentapi.HandlersOut {
	return agentapi.HandlersOut{Handlers: []agentapi.Handler{{
		Pattern: "GET /doctor",
		Handler: func(w http.ResponseWriter, r *http.Request) {
			ctx, cancel := context.WithTimeout(r.Context(), maxRunTime)
			defer cancel()
			report, err := d.Run(ctx)
			if err != nil {
				agentapi.WriteError(w, http.StatusServiceUnavailable, "doctor: %v", err)
				return
			}
			agentapi.WriteJSON(w, r, report)
		},
	}}}
}
