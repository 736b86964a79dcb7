package identity

import (
	"fmt"
	"os"
	"regexp"
	"time"

	"github.com/spf13/pflag"

	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/labels"
)

// Identity allocation modes (Cilium's --identity-allocation-mode values).
const (
	// AllocationModeCRD: identities are CiliumIdentity objects in the
	// Kubernetes API (the Helm chart's default).
	AllocationModeCRD = "crd"
	// AllocationModeKVStore: identities are keys in etcd
	// (cilium/state/identities/v1); needs --kvstore=etcd.
	AllocationModeKVStore = "kvstore"
	// AllocationModeDoubleWriteReadKVStore: Cilium's migration mode;
	// identities are written both as CiliumIdentity objects and as etcd
	// keys, and read from etcd; needs --kvstore=etcd.
	AllocationModeDoubleWriteReadKVStore = "doublewrite-readkvstore"
	// AllocationModeDoubleWriteReadCRD: written to both, read from the
	// CiliumIdentity objects; needs --kvstore=etcd.
	AllocationModeDoubleWriteReadCRD = "doublewrite-readcrd"
)

// writesKVStore says whether mode writes identities to etcd.
func writesKVStore(mode string) bool { return mode != AllocationModeCRD }

// writesCRD says whether mode writes CiliumIdentity objects.
func writesCRD(mode string) bool { return mode != AllocationModeKVStore }

// readsKVStore says whether mode reads identities from etcd.
func readsKVStore(mode string) bool {
	return mode == AllocationModeKVStore || mode == AllocationModeDoubleWriteReadKVStore
}

// Config is the identity allocator's configuration. The flag names and
// defaults are Cilium's.
type Config struct {
	// IdentityAllocationMode selects where identities live: "crd",
	// "kvstore", or both ("doublewrite-readcrd", "doublewrite-readkvstore").
	IdentityAllocationMode string
	// IdentityAllocationTimeout bounds one Allocate call.
	IdentityAllocationTimeout time.Duration
	// Labels are the user's identity label rules (--labels).
	Labels []string
	// LabelPrefixFile replaces the default label rules (--label-prefix-file).
	LabelPrefixFile string
	// ClusterName is the value of the io.cilium.k8s.policy.cluster label.
	ClusterName string
	// ClusterID and MaxConnectedClusters select the identity range.
	ClusterID            uint32
	MaxConnectedClusters uint32
}

// DefaultConfig has Cilium's defaults for a single cluster.
var DefaultConfig = Config{
	IdentityAllocationMode:    AllocationModeCRD,
	IdentityAllocationTimeout: 2 * time.Minute,
	ClusterName:               labels.DefaultClusterName,
	ClusterID:                 0,
	MaxConnectedClusters:      identity.DefaultMaxConnectedClusters,
}

// Flags registers the allocator's flags.
func (def Config) Flags(fs *pflag.FlagSet) {
	fs.String("identity-allocation-mode", def.IdentityAllocationMode, `Where identities are stored: "crd" (CiliumIdentity objects), "kvstore" (etcd keys; needs --kvstore=etcd), or while migrating "doublewrite-readcrd" or "doublewrite-readkvstore" (both written, the named one read; needs --kvstore=etcd)`)
	fs.Duration("identity-allocation-timeout", def.IdentityAllocationTimeout, "Time after which an identity allocation fails")
	fs.StringSlice("labels", def.Labels, `Rules that select the labels that make up an endpoint's identity, "[source:][!]regexp" (e.g. "k8s:app", "!pod-template-hash"); any include rule switches to allow-list mode`)
	fs.String("label-prefix-file", def.LabelPrefixFile, "JSON file of label prefixes that replace the default identity label rules")
	fs.String("cluster-name", def.ClusterName, "Name of the cluster; part of every pod's identity (label io.cilium.k8s.policy.cluster)")
	fs.Uint32("cluster-id", def.ClusterID, "Unique identifier of the cluster (0 for a single cluster); selects the identity range")
	fs.Uint32("max-connected-clusters", def.MaxConnectedClusters, "Maximum number of clusters to connect (255 or 511); splits the identity bits between cluster ID and identity")
}

// maxClusterNameLength is Cilium's limit on --cluster-name.
const maxClusterNameLength = 32

var clusterNameRE = regexp.MustCompile(`^([a-z0-9][-a-z0-9]*)?[a-z0-9]$`)

// Validate checks every flag, so that a bad value stops the agent at start
// instead of failing the first pod.
func (c Config) Validate() error {
	switch c.IdentityAllocationMode {
	case AllocationModeCRD, AllocationModeKVStore, AllocationModeDoubleWriteReadKVStore, AllocationModeDoubleWriteReadCRD:
	default:
		return fmt.Errorf("invalid --identity-allocation-mode=%q: use %q (CiliumIdentity objects), %q (etcd, with --kvstore=etcd), or to migrate between them %q or %q (both written, one read)",
			c.IdentityAllocationMode, AllocationModeCRD, AllocationModeKVStore, AllocationModeDoubleWriteReadCRD, AllocationModeDoubleWriteReadKVStore)
	}
	if c.IdentityAllocationTimeout <= 0 {
		return fmt.Errorf("invalid --identity-allocation-timeout=%s: must be greater than 0", c.IdentityAllocationTimeout)
	}
	if len(c.ClusterName) > maxClusterNameLength || !clusterNameRE.MatchString(c.ClusterName) {
		return fmt.Errorf("invalid --cluster-name=%q: use at most %d lower-case letters, digits and dashes, starting and ending with a letter or digit",
			c.ClusterName, maxClusterNameLength)
	}
	if _, err := c.layout(); err != nil {
		return err
	}
	if _, err := labels.NewFilter(c.Labels); err != nil {
		return err
	}
	return nil
}

// layout is the numeric identity layout of this cluster.
func (c Config) layout() (identity.Layout, error) {
	return identity.NewLayout(c.ClusterID, c.MaxConnectedClusters)
}

// ClusterName is the name of the cluster this agent belongs to
// (--cluster-name). Pass it to labels.FromK8sPod.
type ClusterName string

// LabelFilter splits an endpoint's labels into the labels that make up
// its identity and informational ones, following --labels and
// --label-prefix-file. *labels.Filter implements it.
type LabelFilter interface {
	Split(lbls labels.Labels) (identity, info labels.Labels)
}

func newClusterName(c Config) ClusterName { return ClusterName(c.ClusterName) }

// newLabelFilter builds the filter from the flags. Reading the prefix file
// here (not in a hook) makes a broken file stop the agent at start.
func newLabelFilter(c Config) (LabelFilter, error) {
	if c.LabelPrefixFile == "" {
		return labels.NewFilter(c.Labels)
	}
	f, err := os.Open(c.LabelPrefixFile)
	if err != nil {
		return nil, fmt.Errorf("open --label-prefix-file: %w", err)
	}
	defer f.Close()
	return labels.NewFilterFromFile(f, c.Labels)
}
