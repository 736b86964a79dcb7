// Package netns creates and removes named (pinned) network namespaces the
// way `ip netns add|del` does: the agent's health namespace and the
// dev-kubelet's pod namespaces share it.
package netns

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"runtime"
	"syscall"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// EnsureSharedDir makes dir exist and be a shared mount point, as
// iproute2 does for /var/run/netns, so that namespaces pinned below it
// propagate to other mount namespaces instead of being copied.
func EnsureSharedDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create netns directory: %w", err)
	}
	err := syscall.Mount("", dir, "none", syscall.MS_SHARED|syscall.MS_REC, "")
	if err == nil {
		return nil
	}
	if !errors.Is(err, syscall.EINVAL) {
		return fmt.Errorf("make %s a shared mount: %w", dir, err)
	}
	// Not a mount point yet: bind it onto itself, then share it.
	if err := syscall.Mount(dir, dir, "none", syscall.MS_BIND|syscall.MS_REC, ""); err != nil {
		return fmt.Errorf("bind-mount %s onto itself: %w", dir, err)
	}
	if err := syscall.Mount("", dir, "none", syscall.MS_SHARED|syscall.MS_REC, ""); err != nil {
		return fmt.Errorf("make %s a shared mount: %w", dir, err)
	}
	return nil
}

// Create makes a new network namespace pinned at path (a file that must
// not exist yet, in a directory EnsureSharedDir prepared) with its
// loopback up. On error nothing is left at path.
func Create(path string) error {
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return fmt.Errorf("create netns %s: %w", path, err)
	}
	_ = f.Close()
	// unshare(CLONE_NEWNET) moves the calling thread into the new
	// namespace; the locked thread returns to its namespace before it is
	// unlocked. (A thread left locked in the new namespace is not always
	// ended: the process's main thread is parked instead, and
	// /proc/self/ns/net, the host namespace for everyone else, would then
	// name the new namespace.)
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		self := fmt.Sprintf("/proc/self/task/%d/ns/net", syscall.Gettid())
		orig, err := os.Open(self)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open the thread's network namespace: %w", err)
			return
		}
		defer orig.Close()
		if err := syscall.Unshare(syscall.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("unshare network namespace: %w", err)
			return
		}
		err = syscall.Mount(self, path, "none", syscall.MS_BIND, "")
		if err != nil {
			err = fmt.Errorf("pin network namespace at %s: %w", path, err)
		}
		if serr := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); serr != nil {
			// Stay locked: the runtime must not reuse this thread.
			errc <- errors.Join(err, fmt.Errorf("return to the original network namespace: %w", serr))
			return
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	if err := <-errc; err != nil {
		_ = os.Remove(path)
		return fmt.Errorf("create netns %s: %w", path, err)
	}
	if err := loopbackUp(path); err != nil {
		return errors.Join(fmt.Errorf("set loopback of %s up: %w", path, err), Remove(path))
	}
	return nil
}

// loopbackUp sets "lo" up in the namespace at path.
func loopbackUp(path string) error {
	n, err := ns.GetNS(path)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", path, err)
	}
	defer n.Close()
	return n.Do(func(ns.NetNS) error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	})
}

// Remove unpins and removes the namespace at path; a missing one is not
// an error.
func Remove(path string) error {
	if err := syscall.Unmount(path, syscall.MNT_DETACH); err != nil &&
		!errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
		return fmt.Errorf("unmount netns %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove netns %s: %w", path, err)
	}
	return nil
}
