package kvstore

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/spf13/pflag"
)

// BackendEtcd is the only kvstore backend (Cilium's name).
const BackendEtcd = "etcd"

// Option keys of --kvstore-opt (Cilium's names).
const (
	// OptConfig is the path of an etcd client configuration file (YAML:
	// endpoints, trusted-ca-file, cert-file, key-file).
	OptConfig = "etcd.config"
	// OptAddress is a comma-separated list of etcd endpoints, instead of
	// a configuration file.
	OptAddress = "etcd.address"
)

// Lease TTL bounds of --kvstore-lease-ttl (Cilium's).
const (
	MinLeaseTTL     = 25 * time.Second
	MaxLeaseTTL     = 86400 * time.Second
	DefaultLeaseTTL = 15 * time.Minute
)

// Config is the kvstore configuration; flag names and defaults are
// Cilium's.
type Config struct {
	// KVStore is the backend: "" (none: all state in CRDs) or "etcd".
	KVStore string `flag:"kvstore"`
	// KVStoreOpt are the backend's options (etcd.config, etcd.address).
	KVStoreOpt map[string]string `flag:"kvstore-opt"`
	// KVStoreLeaseTTL is the TTL of the session lease the agent's keys
	// are attached to.
	KVStoreLeaseTTL time.Duration `flag:"kvstore-lease-ttl"`
}

// DefaultConfig has Cilium's defaults: no kvstore.
var DefaultConfig = Config{KVStoreLeaseTTL: DefaultLeaseTTL}

// Flags registers --kvstore, --kvstore-opt and --kvstore-lease-ttl.
func (def Config) Flags(fs *pflag.FlagSet) {
	fs.String("kvstore", def.KVStore, `Key-value store type: "etcd", or empty to keep identities, nodes and the ipcache in Kubernetes CRDs only`)
	fs.StringToString("kvstore-opt", def.KVStoreOpt, `Key-value store options, e.g. etcd.config=/var/lib/etcd-config/etcd.config or etcd.address=http://127.0.0.1:2379`)
	fs.Duration("kvstore-lease-ttl", def.KVStoreLeaseTTL, "Time-to-live of the kvstore lease this agent's keys are attached to (25s to 24h)")
}

// Enabled reports whether a kvstore is configured.
func (c Config) Enabled() bool { return c.KVStore != "" }

// Validate rejects unknown backends and options, options without a
// backend, a backend without endpoints and a lease TTL out of range.
func (c Config) Validate() error {
	switch c.KVStore {
	case "":
		if len(c.KVStoreOpt) > 0 {
			return fmt.Errorf("--kvstore-opt %s given without --kvstore: set --kvstore=etcd or drop the options", optKeys(c.KVStoreOpt))
		}
		return nil
	case BackendEtcd:
	default:
		return fmt.Errorf("invalid --kvstore=%q: cellium supports only %q (or empty for CRD mode)", c.KVStore, BackendEtcd)
	}
	for k := range c.KVStoreOpt {
		if k != OptConfig && k != OptAddress {
			return fmt.Errorf("unknown --kvstore-opt %q: cellium supports %s and %s", k, OptConfig, OptAddress)
		}
	}
	if c.KVStoreOpt[OptConfig] == "" && c.KVStoreOpt[OptAddress] == "" {
		return fmt.Errorf("--kvstore=etcd needs the etcd endpoints: pass --kvstore-opt %s=<file> or --kvstore-opt %s=<url>", OptConfig, OptAddress)
	}
	if c.KVStoreLeaseTTL < MinLeaseTTL || c.KVStoreLeaseTTL > MaxLeaseTTL {
		return fmt.Errorf("invalid --kvstore-lease-ttl=%s: must be between %s and %s", c.KVStoreLeaseTTL, MinLeaseTTL, MaxLeaseTTL)
	}
	return nil
}

func optKeys(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return strings.Join(slices.Compact(keys), ",")
}
