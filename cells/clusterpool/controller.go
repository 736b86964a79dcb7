package clusterpool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/cilium/statedb"
	k8serrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	ciliumclient "github.com/cellium/cellium/api/client/clientset/versioned/typed/cilium.io/v2"
	"github.com/cellium/cellium/cells/clusterpool/cidralloc"
	"github.com/cellium/cellium/cells/hive"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/tables"
)

// Retry bounds for CiliumNodes whose API write failed.
const (
	minRetryBackoff = 500 * time.Millisecond
	maxRetryBackoff = 30 * time.Second
)

// Controller hands out node CIDRs to CiliumNodes. It is the body of the
// cell's leader job; NewController makes one without a hive.
type Controller struct {
	cfg    cidralloc.Config
	nodes  ciliumclient.CiliumNodeInterface
	db     *statedb.DB
	table  statedb.Table[*ciliumv2.CiliumNode]
	log    *slog.Logger
	health hive.Health

	retryMin, retryMax time.Duration
}

// NewController returns a controller that carves cfg's cluster CIDRs,
// watches table and writes through nodes. It only checks cfg.
//
// Possible errors: those of cidralloc.Config.Validate.
func NewController(cfg cidralloc.Config, nodes ciliumclient.CiliumNodeInterface, db *statedb.DB,
	table statedb.Table[*ciliumv2.CiliumNode], log *slog.Logger, health hive.Health,
) (*Controller, error) {
	if _, err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Controller{
		cfg: cfg, nodes: nodes, db: db, table: table, log: log, health: health,
		retryMin: minRetryBackoff, retryMax: maxRetryBackoff,
	}, nil
}

// Run allocates node CIDRs until ctx is cancelled. It waits for the
// CiliumNodes table to be initialized, restores the CIDRs every CiliumNode
// already has, then gives one to each CiliumNode without an IPv4 pod CIDR
// and frees those of deleted CiliumNodes. It returns nil when ctx ends and
// an error only if it cannot start watching the table.
func (c *Controller) Run(ctx context.Context) error {
	defer c.health.Stopped("not leading")
	c.health.OK("waiting for the CiliumNodes table")
	if err := tables.WaitInitialized(ctx, c.db, c.table); err != nil {
		return nil // cancelled
	}
	alloc, err := cidralloc.New(c.cfg)
	if err != nil {
		return err // validated in NewController
	}
	wtxn := c.db.WriteTxn(c.table)
	changes, err := c.table.Changes(wtxn)
	wtxn.Commit()
	if err != nil {
		return fmt.Errorf("watch %s: %w", c.table.Name(), err)
	}
	defer changes.Close()

	r := &run{
		Controller: c, alloc: alloc,
		problems: map[string]string{}, exhausted: map[string]bool{}, failed: map[string]error{},
	}
	backoff := c.retryMin
	var retryC <-chan time.Time
	for {
		// The first batch is every CiliumNode in the table, so their
		// CIDRs are all restored before anything is allocated.
		seq, watch := changes.Next(c.db.ReadTxn())
		latest := map[string]statedb.Change[*ciliumv2.CiliumNode]{}
		for ch := range seq {
			latest[ch.Object.Name] = ch
		}
		r.apply(ctx, latest)
		r.report()

		if len(r.failed) == 0 {
			backoff, retryC = c.retryMin, nil
		} else if retryC == nil {
			retryC = time.After(backoff)
			backoff = min(backoff*2, c.retryMax)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-watch:
		case <-retryC:
			retryC = nil
			r.resync(ctx, slices.Collect(maps.Keys(r.failed)))
			r.report()
		}
	}
}

// run is the state of one leadership term; only Run's goroutine uses it.
type run struct {
	*Controller
	alloc *cidralloc.Allocator
	// problems are the operator-status errors of nodes whose CIDRs cannot
	// be used (invalid, outside the pool, held by another node) or that
	// wait for a free CIDR.
	problems map[string]string
	// exhausted are nodes that found the pool full.
	exhausted map[string]bool
	// failed are nodes whose API write failed; they are retried.
	failed map[string]error
}

// apply processes one batch of changes: frees the CIDRs of deleted nodes,
// restores the CIDRs of every node that has some, then allocates for the
// others.
func (r *run) apply(ctx context.Context, latest map[string]statedb.Change[*ciliumv2.CiliumNode]) {
	names := slices.Sorted(maps.Keys(latest))
	released := false
	for _, name := range names {
		if latest[name].Deleted {
			if len(r.alloc.Lookup(name)) > 0 {
				r.log.Info("released node CIDRs of deleted CiliumNode", "node", name, "cidrs", r.alloc.Lookup(name))
				released = true
			}
			r.alloc.Release(name)
			delete(r.problems, name)
			delete(r.exhausted, name)
			delete(r.failed, name)
		}
	}
	var without []*ciliumv2.CiliumNode
	for _, name := range names {
		ch := latest[name]
		if ch.Deleted {
			continue
		}
		if v4, _ := parsePodCIDRs(ch.Object); len(v4) > 0 {
			r.sync(ctx, ch.Object)
		} else {
			without = append(without, ch.Object)
		}
	}
	for _, cn := range without {
		r.sync(ctx, cn)
	}
	if released {
		// A freed CIDR may serve a node that waits, and a CIDR claimed
		// twice may now be free for the node that lost.
		r.resync(ctx, slices.Collect(maps.Keys(r.problems)))
	}
}

// resync syncs the named nodes again from the current table.
func (r *run) resync(ctx context.Context, names []string) {
	txn := r.db.ReadTxn()
	slices.Sort(names)
	for _, name := range names {
		cn, _, ok := r.table.Get(txn, k8stables.NameIndex[*ciliumv2.CiliumNode]().Query(name))
		if !ok {
			delete(r.failed, name)
			continue
		}
		r.sync(ctx, cn)
	}
}

// sync makes one CiliumNode right: it restores the CIDRs it has or gives
// it one, and publishes a problem in status.ipam.operator-status.error.
func (r *run) sync(ctx context.Context, cn *ciliumv2.CiliumNode) {
	if err := r.syncNode(ctx, cn); err != nil {
		if ctx.Err() != nil {
			return
		}
		if r.failed[cn.Name] == nil {
			r.log.Warn("updating CiliumNode failed, will retry", "node", cn.Name, "error", err)
		}
		r.failed[cn.Name] = err
		return
	}
	delete(r.failed, cn.Name)
}

func (r *run) syncNode(ctx context.Context, cn *ciliumv2.CiliumNode) error {
	name := cn.Name
	v4, invalid := parsePodCIDRs(cn)
	var problem string
	switch {
	case len(v4) > 0:
		problem = r.restore(name, v4, invalid)
		delete(r.exhausted, name)
	case len(invalid) > 0:
		problem = fmt.Sprintf("spec.ipam.podCIDRs has invalid CIDRs %q: remove them so that the operator can allocate one", invalid)
	default:
		cidr, err := r.alloc.Allocate(name)
		if err != nil {
			if errors.Is(err, cidralloc.ErrPoolExhausted) && !r.exhausted[name] {
				r.log.Error("no pod CIDR left for node", "node", name, "error", err)
			}
			r.exhausted[name] = errors.Is(err, cidralloc.ErrPoolExhausted)
			problem = err.Error()
			break
		}
		delete(r.exhausted, name)
		updated, err := r.writeCIDR(ctx, cn, cidr)
		if err != nil {
			return err
		}
		if updated == nil {
			return nil // gone, or given CIDRs by someone else: its next change syncs it
		}
		cn = updated
	}
	if problem == "" {
		delete(r.problems, name)
	} else {
		if r.problems[name] != problem {
			r.log.Warn("CiliumNode has no usable pod CIDR", "node", name, "problem", problem)
		}
		r.problems[name] = problem
	}
	return r.writeProblem(ctx, cn, problem)
}

// restore records the node's IPv4 CIDRs in the allocator and returns what
// is wrong with them ("" if nothing).
func (r *run) restore(name string, v4 []netip.Prefix, invalid []string) string {
	var msgs []string
	if len(invalid) > 0 {
		msgs = append(msgs, fmt.Sprintf("invalid CIDRs %q", invalid))
	}
	if !slices.Equal(r.alloc.Lookup(name), v4) {
		// First sight of the node, a changed spec, or a CIDR that could
		// not be occupied before.
		r.alloc.Release(name)
		for _, p := range v4 {
			if err := r.alloc.Occupy(name, p); err != nil {
				msgs = append(msgs, err.Error())
			}
		}
	}
	if len(msgs) == 0 {
		return ""
	}
	return "spec.ipam.podCIDRs: " + strings.Join(msgs, "; ")
}

// writeCIDR puts cidr first in the node's spec.ipam.podCIDRs. It returns
// the updated object, or nil when the node is gone or already has an IPv4
// CIDR from someone else.
func (r *run) writeCIDR(ctx context.Context, cn *ciliumv2.CiliumNode, cidr netip.Prefix) (*ciliumv2.CiliumNode, error) {
	var updated *ciliumv2.CiliumNode
	first := true
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := cn
		if !first {
			var err error
			if cur, err = r.nodes.Get(ctx, cn.Name, metav1.GetOptions{}); err != nil {
				return err
			}
		}
		first = false
		if v4, _ := parsePodCIDRs(cur); len(v4) > 0 {
			// Already written (the table lags) or written by someone
			// else: hold what the node has; its change event syncs it.
			r.restore(cn.Name, v4, nil)
			updated = nil
			return nil
		}
		next := cur.DeepCopy()
		next.Spec.IPAM.PodCIDRs = append([]string{cidr.String()}, cur.Spec.IPAM.PodCIDRs...)
		var err error
		updated, err = r.nodes.Update(ctx, next, metav1.UpdateOptions{})
		return err
	})
	switch {
	case k8serrors.IsNotFound(err):
		r.alloc.Release(cn.Name)
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("write pod CIDR %s to CiliumNode %s: %w", cidr, cn.Name, err)
	}
	if updated != nil {
		r.log.Info("allocated pod CIDR", "node", cn.Name, "cidr", cidr)
	}
	return updated, nil
}

// writeProblem sets status.ipam.operator-status.error of the node to
// problem, unless it already is.
func (r *run) writeProblem(ctx context.Context, cn *ciliumv2.CiliumNode, problem string) error {
	if cn.Status.IPAM.OperatorStatus.Error == problem {
		return nil
	}
	first := true
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := cn
		if !first {
			var err error
			if cur, err = r.nodes.Get(ctx, cn.Name, metav1.GetOptions{}); err != nil {
				return err
			}
		}
		first = false
		if cur.Status.IPAM.OperatorStatus.Error == problem {
			return nil
		}
		next := cur.DeepCopy()
		next.Status.IPAM.OperatorStatus.Error = problem
		_, err := r.nodes.UpdateStatus(ctx, next, metav1.UpdateOptions{})
		return err
	})
	if err != nil && !k8serrors.IsNotFound(err) {
		return fmt.Errorf("write status.ipam.operator-status of CiliumNode %s: %w", cn.Name, err)
	}
	return nil
}

// report sets the health from the run's state.
func (r *run) report() {
	switch {
	case len(r.exhausted) > 0:
		r.health.Degraded("cluster pool exhausted", fmt.Errorf("%d CiliumNodes wait for a pod CIDR (%s): %w; add a CIDR to --%s or remove nodes",
			len(r.exhausted), strings.Join(slices.Sorted(maps.Keys(r.exhausted)), ", "), cidralloc.ErrPoolExhausted, cidralloc.FlagIPv4CIDR))
	case len(r.problems) > 0:
		names := slices.Sorted(maps.Keys(r.problems))
		r.health.Degraded("CiliumNodes without a usable pod CIDR",
			fmt.Errorf("%d nodes, first %s: %s", len(names), names[0], r.problems[names[0]]))
	case len(r.failed) > 0:
		names := slices.Sorted(maps.Keys(r.failed))
		r.health.Degraded("writing CiliumNodes", fmt.Errorf("%d nodes, first %s: %w", len(names), names[0], r.failed[names[0]]))
	default:
		r.health.OK(fmt.Sprintf("%d of %d node CIDRs allocated", r.alloc.Used(), r.alloc.Capacity()))
	}
}

// parsePodCIDRs returns the node's IPv4 pod CIDRs and the entries that are
// not CIDRs. IPv6 CIDRs are not this pool's and are skipped.
func parsePodCIDRs(cn *ciliumv2.CiliumNode) (v4 []netip.Prefix, invalid []string) {
	for _, s := range cn.Spec.IPAM.PodCIDRs {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		switch {
		case err != nil:
			invalid = append(invalid, s)
		case p.Addr().Is4():
			v4 = append(v4, p)
		}
	}
	return v4, invalid
}
