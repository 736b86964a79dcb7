package healthep

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/cellium/cellium/statedb/health"
)

// responder is the HTTP server of one health namespace.
type responder struct {
	netnsPath string
	inode     uint64
	port      int
	srv       *http.Server
	done      chan struct{} // closed when Serve returned
}

// Handler answers GET health.Path with 200 "OK", as Cilium's responder
// does for its probes; anything else is 404.
func Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+health.Path, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("OK\n"))
	})
	return mux
}

// startResponder listens on port inside the namespace at path (the
// socket is created on a thread switched into it; it stays there after
// the thread switches back) and serves from an ordinary goroutine.
func startResponder(path string, inode uint64, port int) (*responder, error) {
	var ln net.Listener
	err := inNetns(path, func() error {
		var err error
		ln, err = net.Listen("tcp4", ":"+strconv.Itoa(port))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listen on port %d in %s: %w", port, path, err)
	}
	r := &responder{netnsPath: path, inode: inode, port: port, done: make(chan struct{}),
		srv: &http.Server{Handler: Handler(), ReadHeaderTimeout: 5 * time.Second}}
	go func() {
		defer close(r.done)
		_ = r.srv.Serve(ln)
	}()
	return r, nil
}

// serving reports whether the server still runs.
func (r *responder) serving() bool {
	select {
	case <-r.done:
		return false
	default:
		return true
	}
}

// stop closes the listener and every connection and waits for Serve to
// return.
func (r *responder) stop() error {
	err := r.srv.Close()
	<-r.done
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}
