package healthep

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/cellium/cellium/datapath/netns"
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

// ensureNetns makes path a pinned network namespace with its loopback up:
// an existing one is adopted (created false), a file that is not one (an
// unmounted leftover) is replaced.
func ensureNetns(path string) (created bool, err error) {
	if isNetns(path) {
		return false, nil
	}
	if err := netns.EnsureSharedDir(filepath.Dir(path)); err != nil {
		return false, err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("remove stale netns file %s: %w", path, err)
	}
	if err := netns.Create(path); err != nil {
		return false, err
	}
	return true, nil
}

// removeNetns unpins and removes the namespace at path (`ip netns del`);
// a missing one is not an error.
func removeNetns(path string) error { return netns.Remove(path) }

// inNetns runs f on a locked OS thread inside the namespace at path ("" is
// the caller's own).
func inNetns(path string, f func() error) error { return netns.Do(path, f) }

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
