package benchkpr

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"time"
)

// ProbeResult is what a probe that measures prints (one JSON line).
type ProbeResult struct {
	// N is the number of round trips or connects timed.
	N int `json:"n"`
	// PerSecond is N over the wall time they took.
	PerSecond float64 `json:"perSecond"`
	// P50 and P99 are latencies in nanoseconds.
	P50 int64 `json:"p50"`
	P99 int64 `json:"p99"`
}

// Probe runs one probe, the benchmark's client and server processes, which
// the benchmark starts inside a pod's or a node's namespaces (and the
// node's cgroup, where its socket programs apply):
//
//	echo -listen ADDR           echo what each connection sends (a server)
//	rr -addr ADDR -n N          N round trips of 1 byte on one connection
//	connect -addr ADDR -n N     N connects (each closed at once)
//	watch -addr ADDR            connect every -interval, print a line
//	                            "<unix ns> up|down" whenever the answer changes
//
// args are the probe's name and its flags; out receives its output.
func Probe(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 {
		return errors.New("probe: want echo, rr, connect or watch")
	}
	fs := flag.NewFlagSet("probe "+args[0], flag.ContinueOnError)
	addr := fs.String("addr", "", "address to reach (host:port)")
	listen := fs.String("listen", ":7000", "address to listen on (echo)")
	n := fs.Int("n", 1000, "round trips or connects")
	interval := fs.Duration("interval", time.Millisecond, "time between connects (watch)")
	timeout := fs.Duration("timeout", 200*time.Millisecond, "connect timeout")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	switch args[0] {
	case "echo":
		return echo(ctx, *listen)
	case "rr":
		return writeResult(out)(rr(ctx, *addr, *n, *timeout))
	case "connect":
		return writeResult(out)(connects(ctx, *addr, *n, *timeout))
	case "watch":
		return watch(ctx, *addr, *interval, *timeout, out)
	default:
		return fmt.Errorf("probe %q: want echo, rr, connect or watch", args[0])
	}
}

func writeResult(out io.Writer) func(ProbeResult, error) error {
	return func(r ProbeResult, err error) error {
		if err != nil {
			return err
		}
		return json.NewEncoder(out).Encode(r)
	}
}

// echo serves connections that get back every byte they send.
func echo(ctx context.Context, addr string) error {
	l, err := net.Listen("tcp4", addr)
	if err != nil {
		return fmt.Errorf("echo: %w", err)
	}
	go func() { <-ctx.Done(); l.Close() }()
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("echo: accept: %w", err)
		}
		go func() {
			defer c.Close()
			_, _ = io.Copy(c, c)
		}()
	}
}

// rr times n round trips of one byte on one TCP connection.
func rr(ctx context.Context, addr string, n int, timeout time.Duration) (ProbeResult, error) {
	d := net.Dialer{Timeout: timeout}
	c, err := d.DialContext(ctx, "tcp4", addr)
	if err != nil {
		return ProbeResult{}, fmt.Errorf("rr: %w", err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	lat := make([]time.Duration, 0, n)
	b := []byte{'x'}
	began := time.Now()
	for range n {
		t := time.Now()
		if _, err := c.Write(b); err != nil {
			return ProbeResult{}, fmt.Errorf("rr: write: %w", err)
		}
		if _, err := r.ReadByte(); err != nil {
			return ProbeResult{}, fmt.Errorf("rr: read: %w", err)
		}
		lat = append(lat, time.Since(t))
	}
	return summarize(lat, time.Since(began)), nil
}

// connects times n TCP connects to addr; each connection is closed at once
// with a reset (SO_LINGER 0), so that the client ports are not held in
// TIME_WAIT.
func connects(ctx context.Context, addr string, n int, timeout time.Duration) (ProbeResult, error) {
	d := net.Dialer{Timeout: timeout}
	lat := make([]time.Duration, 0, n)
	began := time.Now()
	for range n {
		t := time.Now()
		c, err := d.DialContext(ctx, "tcp4", addr)
		if err != nil {
			return ProbeResult{}, fmt.Errorf("connect: %w", err)
		}
		lat = append(lat, time.Since(t))
		_ = c.(*net.TCPConn).SetLinger(0)
		c.Close()
	}
	return summarize(lat, time.Since(began)), nil
}

// watch connects to addr every interval until ctx ends and prints
// "<unix ns> up" or "<unix ns> down" (the time of the attempt that saw it)
// at the start and whenever the answer changes.
func watch(ctx context.Context, addr string, interval, timeout time.Duration, out io.Writer) error {
	d := net.Dialer{Timeout: timeout}
	last := ""
	for ctx.Err() == nil {
		t := time.Now()
		state := "down"
		if c, err := d.DialContext(ctx, "tcp4", addr); err == nil {
			state = "up"
			_ = c.(*net.TCPConn).SetLinger(0)
			c.Close()
		}
		if state != last && ctx.Err() == nil {
			if _, err := fmt.Fprintf(out, "%d %s\n", t.UnixNano(), state); err != nil {
				return err
			}
			if f, ok := out.(*os.File); ok {
				_ = f.Sync()
			}
			last = state
		}
		select {
		case <-ctx.Done():
		case <-time.After(interval):
		}
	}
	return nil
}

// summarize gives the rate and the percentiles of latencies measured over
// wall time took.
func summarize(lat []time.Duration, took time.Duration) ProbeResult {
	slices.Sort(lat)
	r := ProbeResult{N: len(lat), P50: int64(percentile(lat, 50)), P99: int64(percentile(lat, 99))}
	if took > 0 {
		r.PerSecond = float64(len(lat)) / took.Seconds()
	}
	return r
}

// percentile is the p-th percentile of sorted (nearest rank); 0 if empty.
func percentile(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := (len(sorted)*p + 99) / 100
	return sorted[max(i-1, 0)]
}
