package ipam

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	"time"

	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/cells/statedir"
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
	Lifecycle hive.Lifecycle
	Log       *slog.Logger
}

// newAllocator creates the allocator; its start hook creates the state
// directory and restores the state file.
func newAllocator(p allocatorParams) *allocator {
	store := newStateStore(filepath.Join(string(p.StateDir), StateSubdir, StateFileName), "")
	a := newAllocatorCore(string(p.NodeName), store, p.Log)
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
	Pods        statedb.Table[*corev1.Pod] `optional:"true"`
	Log         *slog.Logger
}

func registerJobs(p jobsParams) {
	a := p.Allocator
	p.Jobs.Add(hive.Service("pod-cidrs", nil, func(ctx context.Context, h hive.Health) {
		followPodCIDRs(ctx, h, p.DB, p.CiliumNodes, a, p.Log)
	}))
	if p.Pods != nil {
		p.Jobs.Add(hive.OneShot("restore-gc", func(ctx context.Context, h hive.Health) error {
			return restoreGC(ctx, h, p.DB, p.Pods, a, restoreGCGrace, restoreGCInterval, p.Log)
		}))
	}
}

// followPodCIDRs feeds the pod CIDRs of this node's CiliumNode to the
// allocator until ctx ends.
func followPodCIDRs(ctx context.Context, h hive.Health, db *statedb.DB, cns statedb.Table[*ciliumv2.CiliumNode], a *allocator, log *slog.Logger) {
	q := k8stables.NameIndex[*ciliumv2.CiliumNode]().Query(a.node)
	for {
		cn, _, watch, found := cns.GetWatch(db.ReadTxn(), q)
		var cidrs []netip.Prefix
		if found {
			cidrs = podCIDRsOf(cn, log)
		}
		_, ready := a.RouterIP()
		switch {
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
