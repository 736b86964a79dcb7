package harness

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"
)

// hostNetworkLockName is the abstract unix socket [LockHostNetwork] binds.
const hostNetworkLockName = "@cellium-host-network-lock"

// LockHostNetwork takes the lock of the things only one test (or make up)
// at a time may own in the caller's network namespace: kube-proxy's
// nftables tables (a real node with kube-proxy) and an agent with host
// routing (cilium_host, its routes, the health endpoint). The lock is an
// abstract unix socket bound in that namespace, so it is exactly as wide
// as what it guards: every process that shares the namespace meets it,
// whatever its HOME, mount namespace or checkout (two CI runs on one
// machine included), and a process that exits, even killed, releases it.
// It serializes test packages that go test runs side by side; waiting is
// called once if another process or goroutine holds it. The returned func
// releases it.
//
// Errors: ctx ends before the lock is free; the socket cannot be made.
func LockHostNetwork(ctx context.Context, waiting func()) (unlock func(), err error) {
	return lockAbstract(ctx, hostNetworkLockName, waiting)
}

// lockAbstract is [LockHostNetwork] for the abstract socket name.
func lockAbstract(ctx context.Context, name string, waiting func()) (unlock func(), err error) {
	told := false
	for {
		l, err := net.ListenUnix("unix", &net.UnixAddr{Name: name, Net: "unix"})
		if err == nil {
			return func() { _ = l.Close() }, nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("lock host network (abstract socket %s): %w", name, err)
		}
		if !told {
			told = true
			waiting()
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("lock host network: %w", context.Cause(ctx))
		case <-time.After(250 * time.Millisecond):
		}
	}
}
