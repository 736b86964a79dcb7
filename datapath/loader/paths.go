package loader

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// Layout names the loader's files under the bpffs mount Root.
type Layout struct {
	// Root is where bpffs is mounted (--bpf-root, /sys/fs/bpf).
	Root string
}

// Dir is the agent's directory, <root>/cellium: the global maps and the
// per-endpoint policy maps are pinned there.
func (l Layout) Dir() string { return filepath.Join(l.Root, "cellium") }

// EndpointsDir holds one directory per endpoint with programs.
func (l Layout) EndpointsDir() string { return filepath.Join(l.Dir(), "endpoints") }

// EndpointDir is endpoint id's directory: its pinned links.
func (l Layout) EndpointDir(id uint16) string {
	return filepath.Join(l.EndpointsDir(), strconv.Itoa(int(id)))
}

// LinkPin is the pin of the link that attaches program prog (one of
// ProgFromContainer, ProgToContainer) for endpoint id.
func (l Layout) LinkPin(id uint16, prog string) string {
	return filepath.Join(l.EndpointDir(id), prog)
}

// MountBPFFS makes sure a bpffs is mounted at root, mounting one if the
// directory is something else (creating it if missing), and creates the
// agent's directories under it.
//
// Errors: root cannot be created or mounted (not root, no bpffs in the
// kernel).
func (l Layout) MountBPFFS() error {
	if l.Root == "" {
		return errors.New("no bpffs root: pass --bpf-root")
	}
	if err := os.MkdirAll(l.Root, 0o755); err != nil {
		return fmt.Errorf("create bpffs mount point %s: %w", l.Root, err)
	}
	mounted, err := IsBPFFS(l.Root)
	if err != nil {
		return err
	}
	if !mounted {
		if err := unix.Mount("bpffs", l.Root, "bpf", 0, "mode=0700"); err != nil {
			return fmt.Errorf("mount bpffs at %s: %w (run the agent as root, mount a bpffs there yourself, pass another --bpf-root, or turn the eBPF datapath off with --enable-bpf-datapath=false)", l.Root, err)
		}
	}
	if err := os.MkdirAll(l.EndpointsDir(), 0o700); err != nil {
		return fmt.Errorf("create %s: %w", l.EndpointsDir(), err)
	}
	return nil
}

// IsBPFFS reports whether dir is the root of a bpffs (or inside one).
func IsBPFFS(dir string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return false, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return uint32(st.Type) == unix.BPF_FS_MAGIC, nil
}
