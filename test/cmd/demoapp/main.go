// Command demoapp is the demo application of the real test node: an HTTP
// server that answers every request with "hello from <hostname>\n" (the pod's
// name), and GET /clientip with the address the request came from (what a
// Service's traffic policy keeps or replaces), on the address given by --listen (default :8080), and says so on
// standard error when it starts. It exits on SIGTERM or SIGINT. test/realnode packs it, built static, into an image of
// its own. With --get URL it is the client instead: it sends GET URL, prints
// the answer's body and exits (1 on failure), so that one demo pod can call
// another: kubectl exec web-1 -- demoapp --get http://<IP of web-2>:8080/
// (or by the Service's name, http://db.demo:8080/, through the cluster
// DNS). With --resolve NAME it looks NAME up through the pod's
// /etc/resolv.conf (Go's resolver: search domains, ndots), prints its
// addresses one a line and exits (1 if the name does not resolve).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	listen := flag.String("listen", ":8080", "address to serve HTTP on")
	get := flag.String("get", "", "send GET to this URL, print the body and exit instead of serving")
	resolve := flag.String("resolve", "", "look this name up, print its addresses and exit instead of serving")
	flag.Parse()
	if *resolve != "" {
		if err := lookup(*resolve); err != nil {
			fmt.Fprintln(os.Stderr, "demoapp:", err)
			os.Exit(1)
		}
		return
	}
	if *get != "" {
		if err := fetch(*get); err != nil {
			fmt.Fprintln(os.Stderr, "demoapp:", err)
			os.Exit(1)
		}
		return
	}
	host, err := os.Hostname()
	if err != nil {
		host = "unknown"
	}
	srv := &http.Server{
		Addr:              *listen,
		ReadHeaderTimeout: 5 * time.Second,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/clientip" {
				ip, _, err := net.SplitHostPort(r.RemoteAddr)
				if err != nil {
					ip = r.RemoteAddr
				}
				fmt.Fprintln(w, ip)
				return
			}
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

// fetch sends GET url (5 second timeout) and copies the body of a 200
// answer to standard output.
func fetch(url string) error {
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	_, err = io.Copy(os.Stdout, resp.Body)
	return err
}

// lookup resolves name (5 second timeout) and prints its addresses.
func lookup(name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupHost(ctx, name)
	if err != nil {
		return err
	}
	for _, a := range addrs {
		fmt.Println(a)
	}
	return nil
}
