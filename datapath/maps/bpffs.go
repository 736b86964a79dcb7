package maps

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// DefaultBPFFSDir is where the agent pins its maps by default, Cilium's
// place with cellium's name.
const DefaultBPFFSDir = "/sys/fs/bpf/cellium"

// IsBPFFS reports whether path is on a mounted bpf filesystem.
func IsBPFFS(path string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false, fmt.Errorf("statfs %s: %w", path, err)
	}
	return uint32(st.Type) == unix.BPF_FS_MAGIC, nil
}

// EnsureBPFFS makes path a directory on a bpf filesystem: it creates the
// directory if missing and mounts a bpffs there unless path already lies on
// one (for example a directory under /sys/fs/bpf). It needs root to mount.
func EnsureBPFFS(path string) error {
	if err := os.MkdirAll(path, 0o755); err != nil {
		return fmt.Errorf("create bpffs dir: %w", err)
	}
	ok, err := IsBPFFS(path)
	if err != nil {
		return err
	}
	if ok {
		return nil
	}
	if err := unix.Mount("bpffs", path, "bpf", 0, "mode=0700"); err != nil {
		if errors.Is(err, unix.EPERM) {
			return fmt.Errorf("mount bpffs at %s: %w (run as root, or mount a bpffs there first)", path, err)
		}
		return fmt.Errorf("mount bpffs at %s: %w", path, err)
	}
	return nil
}
