// Command demoapp is the demo application of the real test node: an HTTP
// server that answers every request with "hello from <hostname>\n" (the pod's
// name), on the address given by --listen (default :8080), and says so on
// standard error when it starts. It exits on SIGTERM or SIGINT. test/realnode packs it, built static, into an image of
// its own.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	listen := flag.String("listen", ":8080", "address to serve HTTP on")
	flag.Parse()
	host, err := os.Hostname()
	if err != nil {
		host = "unknown"
	}
	srv := &http.Server{
		Addr:              *listen,
		ReadHeaderTimeout: 5 * time.Second,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprintf(w, "hello from %s\n", host)
		}),
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	fmt.Fprintf(os.Stderr, "demoapp %s serving HTTP on %s\n", host, *listen)
	select {
	case err := <-errc:
		fmt.Fprintln(os.Stderr, "demoapp:", err)
		os.Exit(1)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintln(os.Stderr, "demoapp:", err)
		os.Exit(1)
	}
}
