package harness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
)

// LockHostNetwork takes the machine-wide lock of the things only one test
// (or make up) at a time may own in this machine's network namespace:
// kube-proxy's nftables tables (a real node with kube-proxy) and an agent
// with host routing (cilium_host, its routes, the health endpoint). It is a
// flock on a file in [CacheDir], so it serializes test packages that go
// test runs side by side; waiting is called once if another process holds
// it. The returned func releases it (a process that exits releases it too).
//
// Errors: ctx ends before the lock is free; the cache directory cannot be
// written.
func LockHostNetwork(ctx context.Context, waiting func()) (unlock func(), err error) {
	cache, err := CacheDir()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return nil, fmt.Errorf("lock host network: %w", err)
	}
	return lockFile(ctx, filepath.Join(cache, "host-network.lock"), waiting)
}
