package devkubelet

import (
	"errors"
	"fmt"
	"golang.org/x/sys/unix"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"syscall"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
)

// DefaultNetnsDir is where `ip netns` keeps named network namespaces; the
// kubelet puts its pods' namespaces there so that `ip netns exec NAME ...`
// works on them.
const DefaultNetnsDir = "/var/run/netns"

// ensureSharedDir makes dir exist and be a shared mount point, as
// iproute2 does, so that the namespace mounts below it propagate to other
// mount namespaces (a runtime's, a test's) instead of being copied.
func ensureSharedDir(dir string) error {
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

// createNetns creates a network namespace and pins it at dir/name, the way
// `ip netns add` does, then brings its loopback up (as a container
// runtime's loopback plugin would). It returns the path. An existing file
// at that path is an error.
func createNetns(dir, name string) (string, error) {
	if err := ensureSharedDir(dir); err != nil {
		return "", err
	}
	path := filepath.Join(dir, name)
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return "", fmt.Errorf("create netns %s: %w", name, err)
	}
	_ = f.Close()

	// unshare(CLONE_NEWNET) moves the calling thread into the new
	// namespace; the locked thread returns to its namespace before it is
	// unlocked. (Left locked, it is not always ended: the process's main
	// thread is parked instead, and /proc/self/ns/net would then name the
	// pod's namespace.)
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
			errc <- errors.Join(err, fmt.Errorf("return to the host network namespace: %w", serr))
			return // stays locked: the runtime must not reuse the thread
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	if err := <-errc; err != nil {
		_ = os.Remove(path)
		return "", fmt.Errorf("create netns %s: %w", name, err)
	}
	if err := loopbackUp(path); err != nil {
		return path, errors.Join(err, removeNetns(path))
	}
	return path, nil
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
			return fmt.Errorf("loopback of %s: %w", path, err)
		}
		if err := netlink.LinkSetUp(lo); err != nil {
			return fmt.Errorf("set loopback of %s up: %w", path, err)
		}
		return nil
	})
}

// removeNetns unpins and removes the namespace at path (`ip netns del`).
// The namespace itself goes away when nothing else holds it. A missing
// path is not an error.
func removeNetns(path string) error {
	if err := syscall.Unmount(path, syscall.MNT_DETACH); err != nil &&
		!errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
		return fmt.Errorf("unmount netns %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove netns %s: %w", path, err)
	}
	return nil
}

// netnsExists reports whether path is a pinned network namespace.
func netnsExists(path string) bool {
	n, err := ns.GetNS(path)
	if err != nil {
		return false
	}
	_ = n.Close()
	return true
}

// CreateNodeNetns creates a network namespace pinned at
// DefaultNetnsDir/name with its loopback up, to serve as a node's own
// namespace (Config.PluginNetns), and returns its path. Remove it with
// RemoveNodeNetns.
func CreateNodeNetns(name string) (string, error) {
	return createNetns(DefaultNetnsDir, name)
}

// RemoveNodeNetns removes a namespace made by CreateNodeNetns, with the
// links in it; a missing one is not an error.
func RemoveNodeNetns(path string) error {
	return removeNetns(path)
}
