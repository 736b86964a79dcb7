// Package httpserve runs an HTTP server for the lifetime of a hive: the
// start hook listens (so a busy address stops start-up with a clear error)
// and serves in the background; the stop hook shuts it down and waits.
package httpserve

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/cellium/cellium/cells/hive"
)

// Hook returns the lifecycle hook of a server for handler on the listener
// that listen opens. what names the server in logs ("metrics", ...).
// onStop, if not nil, runs after the server has stopped.
func Hook(what string, listen func() (net.Listener, error), handler http.Handler, log *slog.Logger, onStop func()) hive.Hook {
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	// Shutdown waits for requests in flight; a streaming handler learns
	// through Stopping that it must end.
	stopping := make(chan struct{})
	var once sync.Once
	srv.RegisterOnShutdown(func() { once.Do(func() { close(stopping) }) })
	srv.BaseContext = func(net.Listener) context.Context {
		return context.WithValue(context.Background(), stoppingKey{}, (<-chan struct{})(stopping))
	}
	done := make(chan struct{})
	return hive.Hook{
		Name: what + "-server",
		OnStart: func(context.Context) error {
			ln, err := listen()
			if err != nil {
				return err
			}
			log.Info("serving "+what, "address", ln.Addr().String())
			go func() {
				defer close(done)
				if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
					log.Error(what+" server failed", "error", err)
				}
			}()
			return nil
		},
		OnStop: func(ctx context.Context) error {
			err := srv.Shutdown(ctx)
			<-done
			if onStop != nil {
				onStop()
			}
			return err
		},
	}
}

type stoppingKey struct{}

// Stopping returns a channel that is closed when the server serving the
// request of ctx (a request's context) starts shutting down. The server
// waits for requests in flight, so a handler that streams until the
// client goes must also end when this channel closes. It returns nil (a
// channel that never closes) for a context of no server made by Hook.
func Stopping(ctx context.Context) <-chan struct{} {
	ch, _ := ctx.Value(stoppingKey{}).(<-chan struct{})
	return ch
}
