// Package operatorapi serves the operator's health endpoint over HTTP.
package operatorapi

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"

	"github.com/spf13/pflag"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/httpserve"
)

// Cell serves GET /healthz on --operator-api-serve-addr.
var Cell = hive.Module("operator-api", "Operator health API",
	hive.Config(DefaultConfig),
	// The HTTP server, from start to stop.
	hive.Invoke(registerServer),
)

// Config is the API's configuration.
type Config struct {
	// OperatorAPIServeAddr is the address of the health API; empty
	// disables it.
	OperatorAPIServeAddr string
}

// DefaultConfig is Cilium's default address.
var DefaultConfig = Config{OperatorAPIServeAddr: "localhost:9234"}

// Flags registers --operator-api-serve-addr.
func (def Config) Flags(fs *pflag.FlagSet) {
	fs.String("operator-api-serve-addr", def.OperatorAPIServeAddr, `Address to serve the operator API on ("" to disable)`)
}

// HealthResponse is the JSON body of GET /v1/healthz.
type HealthResponse struct {
	State   string              `json:"state"`
	Modules []hive.HealthStatus `json:"modules"`
}

func health(reporter hive.HealthReporter) (HealthResponse, bool) {
	resp := HealthResponse{State: "ok", Modules: reporter.Modules()}
	for _, m := range resp.Modules {
		if m.Level == hive.LevelDegraded {
			resp.State = "degraded"
		}
	}
	return resp, resp.State == "ok"
}

func registerServer(cfg Config, lc hive.Lifecycle, reporter hive.HealthReporter, log *slog.Logger) {
	if cfg.OperatorAPIServeAddr == "" {
		return
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		resp, ok := health(reporter)
		if !ok {
			w.WriteHeader(http.StatusInternalServerError)
		}
		fmt.Fprintln(w, resp.State)
	})
	mux.HandleFunc("GET /v1/healthz", func(w http.ResponseWriter, _ *http.Request) {
		resp, _ := health(reporter)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(resp)
	})
	lc.Append(httpserve.Hook("operator-api", func() (net.Listener, error) {
		ln, err := net.Listen("tcp", cfg.OperatorAPIServeAddr)
		if err != nil {
			return nil, fmt.Errorf("listen on --operator-api-serve-addr=%s: %w", cfg.OperatorAPIServeAddr, err)
		}
		return ln, nil
	}, mux, log, nil))
}
