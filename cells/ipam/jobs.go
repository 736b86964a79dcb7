package ipam

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	"slices"
	"time"

	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/cells/statedir"
	"github.com/cellium/cellium/statedb/endpoints"
	ipamtables "github.com/cellium/cellium/statedb/ipam"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/nodes"
	"github.com/cellium/cellium/statedb/tables"
)

// The allocations are kept in <--state-dir>/StateSubdir/StateFileName.
const (
	StateSubdir   = "ipam"
	StateFileName = "allocations.json"
)

// How long after start restored, unclaimed addresses of pods that do not
// exist are kept (the endpoint manager re-claims the addresses of the
// endpoints it restores well before), and how often they are checked
// after that.
const (
	restoreGCGrace    = 2 * time.Minute
	restoreGCInterval = time.Minute
)

// allocatorParams are newAllocator's inputs.
type allocatorParams struct {
	hive.In

	StateDir  statedir.Dir
	NodeName  k8s.NodeName
	DB        *statedb.DB
	Table     statedb.RWTable[*ipamtables.Allocation]
	Lifecycle hive.Lifecycle
	Log       *slog.Logger
}

// newAllocator creates the allocator; its start hook creates the state
// directory and restores the state file.
func newAllocator(p allocatorParams) *allocator {
	store := newStateStore(filepath.Join(string(p.StateDir), StateSubdir, StateFileName), "")
	a := newAllocatorCore(string(p.NodeName), store, p.Log)
	a.attachTable(p.DB, p.Table)
	p.Lifecycle.Append(hive.Hook{
		Name: "ipam-restore",
		OnStart: func(context.Context) error {
			if _, err := p.StateDir.Sub(StateSubdir); err != nil {
				return fmt.Errorf("IPAM state (--state-dir): %w", err)
			}
			id, err := nodes.ReadBootID(nodes.BootIDPath)
			if err != nil {
				p.Log.Warn("boot ID unknown; addresses of pods from before a reboot cannot be told apart", "error", err)
			}
			store.bootID = id
			return a.restore()
		},
	})
	return a
}

// jobsParams are registerJobs' inputs.
type jobsParams struct {
	hive.In

	DB          *statedb.DB
	Jobs        hive.Jobs
	Allocator   *allocator
	CiliumNodes statedb.Table[*ciliumv2.CiliumNode]
	Pods        statedb.Table[*corev1.Pod]         `optional:"true"`
	Endpoints   statedb.Table[*endpoints.Endpoint] `optional:"true"`
	Config      Config
	Log         *slog.Logger
}

func registerJobs(p jobsParams) {
	a := p.Allocator
	p.Jobs.Add(hive.Service("pod-cidrs", nil, func(ctx context.Context, h hive.Health) {
		followPodCIDRs(ctx, h, p.DB, p.CiliumNodes, a, p.Log)
	}))
	// The health endpoint's address, kept across restarts.
	p.Jobs.Add(hive.OneShot("health-ip", func(ctx context.Context, h hive.Health) error {
		return allocateHealthIP(ctx, h, p.DB, p.CiliumNodes, a, p.Log)
	}, hive.WithRetry(-1, time.Second, 30*time.Second)))
	if p.Pods != nil {
		p.Jobs.Add(hive.OneShot("restore-gc", func(ctx context.Context, h hive.Health) error {
			return restoreGC(ctx, h, p.DB, p.Pods, a, restoreGCGrace, restoreGCInterval, p.Log)
		}))
	}
	if p.Endpoints != nil && p.Config.IPAMGCGrace > 0 {
		p.Jobs.Add(hive.Timer("ipam-gc", func(context.Context) error {
			_, err := collectUnused(p.DB, p.Endpoints, a, p.Config.IPAMGCGrace, p.Log)
			return err
		}, p.Config.gcInterval()))
	}
}

// collectUnused frees the pod addresses that no endpoint has used for
// grace, once the endpoints table is initialized (restored endpoints are
// in it), and logs each. An address is in use when an endpoint has it.
// The table is read before the allocator's lock is taken: an endpoint
// inserted after the read claimed its address (Claim) less than grace
// ago, so the collector leaves it alone.
func collectUnused(db *statedb.DB, eps statedb.Table[*endpoints.Endpoint], a *allocator, grace time.Duration, log *slog.Logger) ([]Allocation, error) {
	txn := db.ReadTxn()
	if init, _ := eps.Initialized(txn); !init {
		return nil, nil
	}
	released, err := a.collect(grace, func(ip netip.Addr) bool {
		_, _, found := eps.Get(txn, endpoints.IPIndex.Query(ip))
		return found
	})
	now := a.now()
	for _, r := range released {
		log.Warn("IPAM garbage collector freed an address no endpoint used (an ADD that never finished, or a lost DEL)",
			"ip", r.IP, "owner", r.Owner, "containerID", r.ContainerID, "unusedFor", now.Sub(r.Since).Round(time.Second))
	}
	if err != nil {
		return released, fmt.Errorf("free unused addresses: %w", err)
	}
	return released, nil
}

// followPodCIDRs feeds the pod CIDRs of this node's CiliumNode to the
// allocator until ctx ends.
func followPodCIDRs(ctx context.Context, h hive.Health, db *statedb.DB, cns statedb.Table[*ciliumv2.CiliumNode], a *allocator, log *slog.Logger) {
	q := k8stables.NameIndex[*ciliumv2.CiliumNode]().Query(a.node)
	// Without the API server (a reboot while the control plane is down),
	// serve from the pod CIDRs saved in the state file: they are this
	// node's, and the restored allocations are claimed before the first
	// address is handed out. The CiliumNode's CIDRs take over once seen.
	if saved := a.savedCIDRs(); len(saved) > 0 {
		if err := a.setPodCIDRs(saved); err != nil {
			log.Warn("cannot serve from the pod CIDRs of the state file; waiting for the CiliumNode", "cidrs", saved, "error", err)
		} else {
			log.Info("serving from the pod CIDRs of the state file until the CiliumNode is seen", "cidrs", saved)
			h.OK(fmt.Sprintf("allocating from %v (state file)", saved))
		}
	}
	for {
		cn, _, watch, found := cns.GetWatch(db.ReadTxn(), q)
		var cidrs []netip.Prefix
		if found {
			cidrs = podCIDRsOf(cn, log)
		}
		_, ready := a.RouterIP()
		switch {
		case len(cidrs) == 0 && ready && !found:
			// Not seen yet (API server down?): keep the saved CIDRs.
		case len(cidrs) == 0 && !ready:
			h.Degraded("waiting for pod CIDRs", noPodCIDRError(a.node, nil))
		case len(cidrs) == 0:
			// The CiliumNode lost its CIDRs (re-created?): keep using ours.
			h.OK("CiliumNode has no pod CIDRs; keeping the current ones")
		default:
			if err := a.setPodCIDRs(cidrs); err != nil {
				h.Degraded("pod CIDRs", err)
			} else {
				h.OK(fmt.Sprintf("allocating from %v", cidrs))
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-watch:
		}
	}
}

// savedCIDRs are the pod CIDRs the state file recorded, while the pool
// does not exist yet.
func (a *allocator) savedCIDRs() []netip.Prefix {
	a.mu.RLock()
	defer a.mu.RUnlock()
	if a.pool != nil {
		return nil
	}
	return slices.Clone(a.restoredCIDRs)
}

// podCIDRsOf returns the IPv4 prefixes of spec.ipam.podCIDRs, in order.
func podCIDRsOf(cn *ciliumv2.CiliumNode, log *slog.Logger) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range cn.Spec.IPAM.PodCIDRs {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			log.Warn("ignoring an invalid pod CIDR of the CiliumNode", "node", cn.Name, "cidr", s, "error", err)
			continue
		}
		if p.Addr().Is4() {
			out = append(out, p)
		}
	}
	return out
}

// restoreGC releases restored addresses that nobody claimed again and
// whose pod is not in the pods table, grace after the pool exists and
// the pods table is initialized, then every interval until none is left.
// An address whose pod exists stays: its endpoint may still be restored.
func restoreGC(ctx context.Context, h hive.Health, db *statedb.DB, pods statedb.Table[*corev1.Pod], a *allocator, grace, interval time.Duration, log *slog.Logger) error {
	select {
	case <-a.ready:
	case <-ctx.Done():
		return nil
	}
	if !hasUnclaimedPods(a) {
		return nil
	}
	if err := tables.WaitInitialized(ctx, db, pods); err != nil {
		return nil // cancelled
	}
	wait := grace
	podIndex := k8stables.NameIndex[*corev1.Pod]()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		wait = interval
		txn := db.ReadTxn()
		released, err := a.releaseUnclaimed(func(owner string) bool {
			if !isPodOwner(owner) {
				return false
			}
			_, _, found := pods.Get(txn, podIndex.Query(owner))
			return !found
		})
		for _, r := range released {
			log.Info("released a restored address: its pod no longer exists", "ip", r.IP, "owner", r.Owner)
		}
		if err != nil {
			h.Degraded("release restored addresses", err)
		}
		if !hasUnclaimedPods(a) {
			return err
		}
	}
}

// hasUnclaimedPods reports whether a restored address of a pod is still
// unclaimed.
func hasUnclaimedPods(a *allocator) bool {
	for _, owner := range a.unclaimedOwners() {
		if isPodOwner(owner) {
			return true
		}
	}
	return false
}
