// Package bpfconfig is the one place of the BPF datapath's shared
// configuration: whether the agent programs BPF at all
// (--enable-bpf-datapath) and where bpffs is (--bpf-root). The agent
// provides Config once (daemon/bpfmaps.ConfigCell, hive.Config); every
// datapath cell that touches BPF (the loader, the map reconcilers) reads
// it from the hive instead of declaring these flags itself.
package bpfconfig

import (
	"fmt"
	"path/filepath"

	"github.com/spf13/pflag"
)

// PinSubdir is the directory under --bpf-root holding the agent's pinned
// maps.
const PinSubdir = "cellium"

// Config is the BPF datapath's configuration.
type Config struct {
	// EnableBPFDatapath switches the BPF datapath on: programs on the
	// pods' veths and the maps they read.
	EnableBPFDatapath bool `flag:"enable-bpf-datapath"`
	// BPFRoot is the bpffs mount point.
	BPFRoot string `flag:"bpf-root"`
}

// DefaultConfig leaves the BPF datapath off; bpffs at its usual place.
var DefaultConfig = Config{BPFRoot: "/sys/fs/bpf"}

// Flags registers --enable-bpf-datapath and --bpf-root.
func (def Config) Flags(fs *pflag.FlagSet) {
	fs.Bool("enable-bpf-datapath", def.EnableBPFDatapath,
		"Program the BPF datapath: policy programs on the pods' veths and the ipcache, endpoint and policy maps they read")
	fs.String("bpf-root", def.BPFRoot, "Path to the bpffs mount; the agent pins its maps in <bpf-root>/"+PinSubdir)
}

// Validate implements hive.Validator.
func (c Config) Validate() error {
	if c.EnableBPFDatapath && !filepath.IsAbs(c.BPFRoot) {
		return fmt.Errorf("--bpf-root %q is not an absolute path: give the bpffs mount point, e.g. /sys/fs/bpf", c.BPFRoot)
	}
	return nil
}

// PinDir is the directory of the agent's pinned maps.
func (c Config) PinDir() string { return filepath.Join(c.BPFRoot, PinSubdir) }
