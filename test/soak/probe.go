package soak

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
)

// Ports of the soak's TCP servers inside pods: the policy probes' (one
// server per probed pod, for one quiescent point) and the pinned flow's
// (for the whole run).
const (
	probePort = 8080
	flowPort  = 8081
)

// echoServer echoes every TCP connection to a pod's address and port,
// from a socket made inside the pod's network namespace; the soak
// process is the pod's only "process". Close it before the pod is torn
// down: an open socket keeps the namespace, and with it the veth, alive.
type echoServer struct {
	ln    net.Listener
	mu    sync.Mutex
	conns map[net.Conn]bool
	wg    sync.WaitGroup
}

// listenIn starts an echo server on addr inside the network namespace
// at netnsPath.
func listenIn(netnsPath string, addr netip.AddrPort) (*echoServer, error) {
	var ln net.Listener
	err := ns.WithNetNSPath(netnsPath, func(ns.NetNS) error {
		var err error
		ln, err = net.Listen("tcp4", addr.String())
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listen on %s in %s: %w", addr, netnsPath, err)
	}
	e := &echoServer{ln: ln, conns: map[net.Conn]bool{}}
	e.wg.Go(e.accept)
	return e, nil
}

func (e *echoServer) accept() {
	for {
		c, err := e.ln.Accept()
		if err != nil {
			return
		}
		e.mu.Lock()
		e.conns[c] = true
		e.mu.Unlock()
		e.wg.Go(func() {
			_, _ = io.Copy(c, c)
			_ = c.Close()
			e.mu.Lock()
			delete(e.conns, c)
			e.mu.Unlock()
		})
	}
}

// Close stops the server and closes its connections.
func (e *echoServer) Close() {
	_ = e.ln.Close()
	e.mu.Lock()
	for c := range e.conns {
		_ = c.Close()
	}
	e.mu.Unlock()
	e.wg.Wait()
}

// dialIn connects to dst from inside the network namespace at
// netnsPath. nsErr is set when the namespace cannot be entered (the
// attempt says nothing about the datapath), err when the connection
// fails.
func dialIn(netnsPath string, dst netip.AddrPort, timeout time.Duration) (c net.Conn, nsErr, err error) {
	n, nsErr := ns.GetNS(netnsPath)
	if nsErr != nil {
		return nil, nsErr, nil
	}
	defer n.Close()
	nsErr = n.Do(func(ns.NetNS) error {
		c, err = net.DialTimeout("tcp4", dst.String(), timeout)
		return nil
	})
	return c, nsErr, err
}

// probeTCP connects from the namespace at netnsPath to dst and exchanges
// one message: true if the echo came back within timeout. A refused or
// timed-out connection is false with no error; an error is the probe's
// own failure (the namespace cannot be entered).
func probeTCP(netnsPath string, dst netip.AddrPort, timeout time.Duration) (bool, error) {
	c, nsErr, err := dialIn(netnsPath, dst, timeout)
	if nsErr != nil {
		return false, fmt.Errorf("enter %s: %w", netnsPath, nsErr)
	}
	if err != nil {
		return false, nil
	}
	defer func() {
		// No TIME_WAIT left in the pod's namespace.
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		_ = c.Close()
	}()
	return exchange(c, []byte("cellium soak probe"), timeout) == nil, nil
}

// exchange writes msg on c and reads its echo within timeout.
func exchange(c net.Conn, msg []byte, timeout time.Duration) error {
	_ = c.SetDeadline(time.Now().Add(timeout))
	defer func() { _ = c.SetDeadline(time.Time{}) }()
	if _, err := c.Write(msg); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		return fmt.Errorf("read the echo: %w", err)
	}
	if !bytes.Equal(got, msg) {
		return fmt.Errorf("the echo differs: %q, sent %q", got, msg)
	}
	return nil
}
