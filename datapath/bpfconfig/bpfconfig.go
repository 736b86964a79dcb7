// Package bpfconfig is the one place of the BPF datapath's shared
// configuration: the switch (--enable-bpf-datapath, EnableFlag, a
// hive.Feature whose cells are in the graph only when it is on) and where
// bpffs is (--bpf-root, Config). Every cell that touches BPF (the loader,
// the map reconcilers) belongs under that one feature and reads Config
// from the hive instead of declaring these flags itself.
package bpfconfig

import (
	"fmt"
	"path/filepath"

	"github.com/spf13/pflag"
)

// The BPF datapath's switch, for hive.Feature(EnableFlag, EnableDefault,
// EnableUsage, ...).
const (
	EnableFlag    = "enable-bpf-datapath"
	EnableDefault = true
	EnableUsage   = "Program the BPF datapath: policy programs on the pods' veths and the ipcache, endpoint and policy maps they read"
)

// PinSubdir is the directory under --bpf-root holding the agent's pinned
// maps.
const PinSubdir = "cellium"

// Config is the BPF datapath's configuration.
type Config struct {
	// BPFRoot is the bpffs mount point.
	BPFRoot string `flag:"bpf-root"`
}

// DefaultConfig has bpffs at its usual place.
var DefaultConfig = Config{BPFRoot: "/sys/fs/bpf"}

// Flags registers --bpf-root.
func (def Config) Flags(fs *pflag.FlagSet) {
	fs.String("bpf-root", def.BPFRoot, "Path to the bpffs mount (mounted there if absent); the agent pins its maps in <bpf-root>/"+PinSubdir)
}

// Validate implements hive.Validator.
func (c Config) Validate() error {
	if !filepath.IsAbs(c.BPFRoot) {
		return fmt.Errorf("--bpf-root %q is not an absolute path: give the bpffs mount point, e.g. %s", c.BPFRoot, DefaultConfig.BPFRoot)
	}
	return nil
}

// PinDir is the directory of the agent's pinned maps.
func (c Config) PinDir() string { return filepath.Join(c.BPFRoot, PinSubdir) }
