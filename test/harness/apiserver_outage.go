package harness

import (
	"context"
	"fmt"
	"time"

	utilnet "k8s.io/apimachinery/pkg/util/net"
)

// StopAPIServer stops kube-apiserver (SIGTERM, then SIGKILL after
// Options.StopTimeout) and leaves etcd, the certificates and the work
// directory alone, so that [Cluster.StartAPIServer] brings the same API
// back on the same address. Not to be called concurrently with Stop or
// StartAPIServer.
func (c *Cluster) StopAPIServer() error {
	r := c.running(KubeAPIServer)
	if r == nil {
		return fmt.Errorf("stop kube-apiserver: not running")
	}
	if err := r.Stop(c.opts.StopTimeout); err != nil {
		return err
	}
	if c.httpClient != nil {
		utilnet.CloseIdleConnectionsFor(c.httpClient.Transport)
	}
	return nil
}

// StartAPIServer starts kube-apiserver again after [Cluster.StopAPIServer],
// with the same port and flags, and waits until it is ready.
func (c *Cluster) StartAPIServer(ctx context.Context) error {
	r := c.running(KubeAPIServer)
	if r == nil {
		return fmt.Errorf("start kube-apiserver: it was never started")
	}
	select {
	case <-r.Done():
	default:
		return fmt.Errorf("start kube-apiserver: still running (pid %d)", r.Pid())
	}
	c.forget(r)
	began := time.Now()
	if _, err := c.startAndWait(ctx, r.proc, c.Ready); err != nil {
		return fmt.Errorf("start kube-apiserver again: %w", err)
	}
	c.log.Debug("kube-apiserver started again", "took", time.Since(began).Round(time.Millisecond))
	return nil
}

// running returns the last process started under name, or nil.
func (c *Cluster) running(name string) *Running {
	for i := len(c.procs) - 1; i >= 0; i-- {
		if c.procs[i].Name() == name {
			return c.procs[i]
		}
	}
	return nil
}
