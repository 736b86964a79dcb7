package pprof

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"strconv"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/httpserve"
)

type serverParams struct {
	hive.In
	Lifecycle hive.Lifecycle
	Log       *slog.Logger
}

// Handler serves net/http/pprof's pages under /debug/pprof/ on its own
// mux (not http.DefaultServeMux, which the agent does not serve).
func Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// register adds the server's start and stop hooks when profiling is on.
func register(s settings, p serverParams) {
	if !s.enabled {
		return
	}
	addr := net.JoinHostPort(s.address, strconv.Itoa(int(s.port)))
	p.Lifecycle.Append(httpserve.Hook("pprof", func() (net.Listener, error) {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("pprof: listen on %s (%s): %w", addr, s.flag, err)
		}
		return ln, nil
	}, Handler(), p.Log, nil))
}
