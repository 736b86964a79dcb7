package healthep

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"syscall"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// isNetns reports whether path is a pinned network namespace.
func isNetns(path string) bool {
	n, err := ns.GetNS(path)
	if err != nil {
		return false
	}
	_ = n.Close()
	return true
}

// netnsInode identifies the namespace pinned at path.
func netnsInode(path string) (uint64, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return 0, fmt.Errorf("stat netns %s: %w", path, err)
	}
	return st.Ino, nil
}

// ensureSharedDir makes dir exist and be a shared mount point, as iproute2
// does for /var/run/netns, so that namespaces pinned below it are seen by
// other mount namespaces.
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
	if err := syscall.Mount(dir, dir, "none", syscall.MS_BIND|syscall.MS_REC, ""); err != nil {
		return fmt.Errorf("bind-mount %s onto itself: %w", dir, err)
	}
	if err := syscall.Mount("", dir, "none", syscall.MS_SHARED|syscall.MS_REC, ""); err != nil {
		return fmt.Errorf("make %s a shared mount: %w", dir, err)
	}
	return nil
}

// ensureNetns makes path a pinned network namespace with its loopback up:
// an existing one is adopted (created false), a file that is not one (an
// unmounted leftover) is replaced.
func ensureNetns(path string) (created bool, err error) {
	if isNetns(path) {
		return false, nil
	}
	if err := ensureSharedDir(filepath.Dir(path)); err != nil {
		return false, err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("remove stale netns file %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return false, fmt.Errorf("create netns %s: %w", path, err)
	}
	_ = f.Close()
	// unshare(CLONE_NEWNET) moves the calling thread into the new
	// namespace: it runs on a locked thread that is moved back to its
	// namespace before it is unlocked. (A thread left locked in the new
	// namespace is not always ended: if it is the process's main thread,
	// the runtime parks it, and /proc/self/ns/net, the host namespace
	// for everyone else, would then name the health namespace.)
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		self := fmt.Sprintf("/proc/self/task/%d/ns/net", syscall.Gettid())
		orig, err := os.Open(self)
		if err != nil {
			errc <- fmt.Errorf("open the thread's network namespace: %w", err)
			runtime.UnlockOSThread()
			return
		}
		defer orig.Close()
		if err := syscall.Unshare(syscall.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare network namespace: %w", err)
			runtime.UnlockOSThread()
			return
		}
		err = syscall.Mount(self, path, "none", syscall.MS_BIND, "")
		if err != nil {
			err = fmt.Errorf("pin network namespace: %w", err)
		}
		if serr := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); serr != nil {
			// Stay locked: the runtime must not reuse this thread.
			errc <- errors.Join(err, fmt.Errorf("return to the agent's network namespace: %w", serr))
			return
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	if err := <-errc; err != nil {
		_ = os.Remove(path)
		return false, fmt.Errorf("create netns %s: %w", path, err)
	}
	if err := inNetns(path, func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	}); err != nil {
		return true, errors.Join(fmt.Errorf("set loopback of %s up: %w", path, err), removeNetns(path))
	}
	return true, nil
}

// removeNetns unpins and removes the namespace at path (`ip netns del`);
// a missing one is not an error.
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

// inNetns runs f on a locked OS thread inside the namespace at path ("" is
// the caller's own).
func inNetns(path string, f func() error) error {
	if path == "" {
		path = "/proc/self/ns/net"
	}
	n, err := ns.GetNS(path)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", path, err)
	}
	defer n.Close()
	return n.Do(func(ns.NetNS) error { return f() })
}

// linkAttrs returns the index and MAC of the link called name in the
// namespace at path.
func linkAttrs(path, name string) (index int, mac string, err error) {
	err = inNetns(path, func() error {
		l, err := netlink.LinkByName(name)
		if err != nil {
			return fmt.Errorf("link %s: %w", name, err)
		}
		index, mac = l.Attrs().Index, l.Attrs().HardwareAddr.String()
		return nil
	})
	return index, mac, err
}
