package identity

import (
	"fmt"
	"log/slog"

	"github.com/cilium/statedb"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	ciliumv2client "github.com/cellium/cellium/api/client/clientset/versioned/typed/cilium.io/v2"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/cells/kvstore"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/nodes"
	"github.com/cellium/cellium/statedb/reconciler"
)

// Cell allocates identities in CRD or kvstore mode and provides
// Allocator, LabelFilter and ClusterName. In kvstore mode it also points
// the CiliumIdentity table at etcd (k8s.CiliumIdentitiesSource), so that
// every reader of the table works unchanged.
var Cell = hive.Module("identity-allocator", "Allocates numeric security identities as CiliumIdentity objects",
	// Flags: mode, timeout, label rules, cluster name and ID.
	hive.Config(DefaultConfig),
	// This agent's references, one row per identity it uses
	// (statedb/identity): writable only here, by the allocator...
	hive.ProvidePrivate(identity.NewAllocationsTable),
	// ...and read by the doctor (references) and the CLI.
	hive.Provide(statedb.RWTable[*identity.Allocation].ToTable),
	// The allocator itself; registers its jobs (watch, reconciler); it finds
	// identities by labels with the CiliumIdentity table's labels index.
	hive.ProvidePrivate(newAllocator),
	// The allocator's narrow interface, which the responder below uses
	// (no other cell may: test/layout).
	hive.Provide(asAllocator),
	// Answers the endpoint manager's identity requests (its
	// identity-requests table) and holds their references.
	Responder,
	// The endpoint manager turns pod labels into identity labels with these.
	hive.Provide(newLabelFilter, newClusterName),
	// GET /v1/identity and /v1/identity/{id}.
	hive.Provide(apiHandlers),
	// In kvstore mode the CiliumIdentity table mirrors etcd's master keys.
	hive.Provide(newIdentitiesSource),
)

// newIdentitiesSource makes the CiliumIdentity table mirror etcd in
// kvstore mode (and the API server otherwise).
func newIdentitiesSource(p identitiesSourceParams) (k8s.CiliumIdentitiesSource, error) {
	mode := p.Config.IdentityAllocationMode
	if writesKVStore(mode) && p.KVStore == nil {
		return k8s.CiliumIdentitiesSource{}, needsKVStore(mode)
	}
	if !readsKVStore(mode) {
		return k8s.CiliumIdentitiesSource{}, nil
	}
	return k8s.CiliumIdentitiesSource{LW: p.KVStore.IdentitiesListerWatcher(p.Log)}, nil
}

// identitiesSourceParams are newIdentitiesSource's inputs.
type identitiesSourceParams struct {
	hive.In

	Config  Config
	Log     *slog.Logger
	KVStore *kvstore.Client `optional:"true"`
}

// needsKVStore is the error of a mode that writes etcd without --kvstore.
func needsKVStore(mode string) error {
	return fmt.Errorf("--identity-allocation-mode=%s needs --kvstore=etcd and --kvstore-opt etcd.config=<file> (or use --identity-allocation-mode=%s)",
		mode, AllocationModeCRD)
}

func asAllocator(a *allocator) Allocator { return a }

// allocatorParams are newAllocator's inputs.
type allocatorParams struct {
	hive.In

	Config      Config
	Log         *slog.Logger
	DB          *statedb.DB
	Jobs        hive.Jobs
	Clientset   k8s.Clientset
	Identities  statedb.Table[*ciliumv2.CiliumIdentity]
	Allocations statedb.RWTable[*identity.Allocation]
	Metrics     reconciler.Metrics `optional:"true"`
	// KVStore is the etcd client (nil without --kvstore); the local-node
	// table and node name give the value keys' node suffix (its IP).
	KVStore   *kvstore.Client                 `optional:"true"`
	LocalNode statedb.Table[*nodes.LocalNode] `optional:"true"`
	NodeName  k8s.NodeName                    `optional:"true"`
}

// newAllocator builds the allocator for the cluster's identity range and
// registers its jobs. It contacts nobody.
func newAllocator(p allocatorParams) (*allocator, error) {
	layout, err := p.Config.layout()
	if err != nil {
		return nil, err
	}
	opts := allocatorOptions{
		Min:     layout.MinAllocation(),
		Max:     layout.MaxAllocation(),
		Timeout: p.Config.IdentityAllocationTimeout,
		Metrics: p.Metrics,
	}
	if mode := p.Config.IdentityAllocationMode; writesKVStore(mode) {
		if p.KVStore == nil {
			return nil, needsKVStore(mode)
		}
		if p.LocalNode == nil {
			return nil, fmt.Errorf("--identity-allocation-mode=%s needs the local node's IP (node discovery)", mode)
		}
		opts.KV = &kvBackend{log: p.Log, kv: p.KVStore, min: opts.Min, max: opts.Max,
			suffix: localNodeSuffix(p.DB, p.LocalNode, string(p.NodeName))}
		// The migration modes write CiliumIdentity objects too, and
		// read from one of the two.
		opts.DoubleWrite = writesCRD(mode)
		opts.ReadKV = readsKVStore(mode)
	}
	return startAllocator(p, opts)
}

// startAllocator is newAllocator with explicit options (tests use a tiny
// range).
func startAllocator(p allocatorParams, opts allocatorOptions) (*allocator, error) {
	var client ciliumv2client.CiliumIdentityInterface
	if p.Clientset.IsEnabled() {
		client = p.Clientset.Cilium().CiliumV2().CiliumIdentities()
	}
	a, err := newAllocatorWith(p.Log, p.DB, p.Identities, p.Allocations, client, opts)
	if err != nil {
		return nil, err
	}
	p.Jobs.Add(a.jobs()...)
	return a, nil
}
