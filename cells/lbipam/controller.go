package lbipam

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	k8serrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	ciliumclient "github.com/cellium/cellium/api/client/clientset/versioned/typed/cilium.io/v2"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/statedb/tables"
)

// Retry bounds after a failed API write.
const (
	minRetryBackoff = 200 * time.Millisecond
	maxRetryBackoff = 30 * time.Second
)

// eventReasonPodCIDROverlap is the reason of the Warning Event on a pool
// that overlaps a pod CIDR.
const eventReasonPodCIDROverlap = "PodCIDROverlap"

// eventSource is the component of the Events the controller writes.
const eventSource = "cilium-operator-lb-ipam"

// Tables are the controller's inputs.
type Tables struct {
	Services    statedb.Table[*corev1.Service]
	Pools       statedb.Table[*ciliumv2.CiliumLoadBalancerIPPool]
	CiliumNodes statedb.Table[*ciliumv2.CiliumNode]
}

// Controller runs LB IPAM: the body of the cell's leader job.
type Controller struct {
	cfg    Config
	core   kubernetes.Interface
	pools  ciliumclient.CiliumLoadBalancerIPPoolInterface
	db     *statedb.DB
	tables Tables
	log    *slog.Logger
	health hive.Health
}

// NewController returns a controller that reads the tables and writes
// through core (Services' status, Events) and pools.
func NewController(cfg Config, core kubernetes.Interface, pools ciliumclient.CiliumLoadBalancerIPPoolInterface,
	db *statedb.DB, t Tables, log *slog.Logger, health hive.Health,
) *Controller {
	return &Controller{cfg: cfg, core: core, pools: pools, db: db, tables: t, log: log, health: health}
}

// Run hands out addresses until ctx is cancelled. It waits for the three
// tables' first sync, so that the first pass rebuilds every allocation
// from the Services' status before it hands out anything; each change to
// a table then runs a pass again. Failed writes are retried with backoff.
func (c *Controller) Run(ctx context.Context) error {
	defer c.health.Stopped("not leading")
	c.health.OK("waiting for the Services, pools and CiliumNodes tables")
	if err := tables.WaitInitialized(ctx, c.db, c.tables.Services, c.tables.Pools, c.tables.CiliumNodes); err != nil {
		return nil // cancelled
	}
	st := NewState(c.cfg.DefaultLBServiceIPAM == DefaultLBClassLBIPAM)
	evs := map[string]string{} // pool -> last overlap message announced
	backoff := minRetryBackoff
	var retryC <-chan time.Time
	for {
		txn := c.db.ReadTxn()
		svcSeq, w1 := c.tables.Services.AllWatch(txn)
		poolSeq, w2 := c.tables.Pools.AllWatch(txn)
		nodeSeq, w3 := c.tables.CiliumNodes.AllWatch(txn)
		var (
			svcs  []*corev1.Service
			pools []*ciliumv2.CiliumLoadBalancerIPPool
			cidrs []PodCIDR
		)
		for s := range svcSeq {
			svcs = append(svcs, s)
		}
		for p := range poolSeq {
			pools = append(pools, p)
		}
		for n := range nodeSeq {
			for _, s := range n.Spec.IPAM.PodCIDRs {
				if p, err := netip.ParsePrefix(strings.TrimSpace(s)); err == nil {
					cidrs = append(cidrs, PodCIDR{Node: n.Name, Prefix: p})
				}
			}
		}
		out := st.Reconcile(pools, cidrs, svcs)
		failed := c.write(ctx, out, evs)
		if ctx.Err() != nil {
			return nil
		}
		c.report(out, failed)
		if failed == 0 {
			backoff, retryC = minRetryBackoff, nil
		} else if retryC == nil {
			retryC = time.After(backoff)
			backoff = min(backoff*2, maxRetryBackoff)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-w1:
		case <-w2:
		case <-w3:
		case <-retryC:
			retryC = nil
		}
	}
}

// write applies an outcome to the API server and returns how many writes
// failed.
func (c *Controller) write(ctx context.Context, out Outcome, evs map[string]string) int {
	failed := 0
	for key, ips := range out.Released {
		c.log.Info("released LoadBalancer addresses", "service", key, "ips", ips)
	}
	for name, probs := range out.Problems {
		c.log.Warn("CiliumLoadBalancerIPPool has invalid parts, skipped", "pool", name, "problems", probs)
	}
	for _, o := range out.Services {
		if err := c.writeService(ctx, o); err != nil {
			if ctx.Err() != nil {
				return failed
			}
			failed++
			c.log.Warn("updating Service status failed, will retry", "service", o.Service.Namespace+"/"+o.Service.Name, "error", err)
		}
	}
	for _, o := range out.Pools {
		if err := c.writePool(ctx, o); err != nil {
			if ctx.Err() != nil {
				return failed
			}
			failed++
			c.log.Warn("updating CiliumLoadBalancerIPPool status failed, will retry", "pool", o.Pool.Name, "error", err)
		}
		if o.PodCIDROverlap != "" && evs[o.Pool.Name] != o.PodCIDROverlap {
			if err := c.event(ctx, o.Pool, o.PodCIDROverlap); err != nil {
				failed++
				c.log.Warn("writing Event failed, will retry", "pool", o.Pool.Name, "error", err)
			} else {
				c.log.Warn("CiliumLoadBalancerIPPool overlaps pod CIDRs", "pool", o.Pool.Name, "overlap", o.PodCIDROverlap)
				evs[o.Pool.Name] = o.PodCIDROverlap
			}
		}
		if o.PodCIDROverlap == "" {
			delete(evs, o.Pool.Name)
		}
	}
	return failed
}

// serviceStatus returns svc's status as the outcome wants it.
func serviceStatus(svc *corev1.Service, o ServiceOutcome) corev1.ServiceStatus {
	st := *svc.Status.DeepCopy()
	if !o.Responsible {
		st.LoadBalancer.Ingress = nil
		meta.RemoveStatusCondition(&st.Conditions, ciliumv2.ServiceRequestSatisfiedCondition)
		return st
	}
	var ing []corev1.LoadBalancerIngress
	for _, a := range o.IPs {
		// Keep what else the entry says (ports, ipMode) when it is there.
		i := slices.IndexFunc(svc.Status.LoadBalancer.Ingress, func(e corev1.LoadBalancerIngress) bool { return e.IP == a.String() })
		if i >= 0 {
			ing = append(ing, svc.Status.LoadBalancer.Ingress[i])
		} else {
			ing = append(ing, corev1.LoadBalancerIngress{IP: a.String()})
		}
	}
	st.LoadBalancer.Ingress = ing
	status := metav1.ConditionFalse
	if o.Satisfied {
		status = metav1.ConditionTrue
	}
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{
		Type: ciliumv2.ServiceRequestSatisfiedCondition, Status: status,
		ObservedGeneration: svc.Generation, Reason: o.Reason, Message: o.Message,
	})
	return st
}

// writeService sets the Service's status as the outcome wants it, unless
// it already is.
func (c *Controller) writeService(ctx context.Context, o ServiceOutcome) error {
	svc := o.Service
	api := c.core.CoreV1().Services(svc.Namespace)
	first := true
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := svc
		if !first {
			var err error
			if cur, err = api.Get(ctx, svc.Name, metav1.GetOptions{}); err != nil {
				return err
			}
			if cur.UID != svc.UID {
				return nil // replaced: its own change event brings it
			}
		}
		first = false
		want := serviceStatus(cur, o)
		if equality.Semantic.DeepEqual(cur.Status, want) {
			return nil
		}
		next := cur.DeepCopy()
		next.Status = want
		_, err := api.UpdateStatus(ctx, next, metav1.UpdateOptions{FieldManager: eventSource})
		if err == nil && o.Responsible && len(o.IPs) > 0 && !slices.ContainsFunc(cur.Status.LoadBalancer.Ingress, func(e corev1.LoadBalancerIngress) bool {
			return e.IP == o.IPs[0].String()
		}) {
			c.log.Info("assigned LoadBalancer address", "service", svc.Namespace+"/"+svc.Name, "ips", o.IPs)
		}
		return err
	})
	if err != nil && !k8serrors.IsNotFound(err) {
		return fmt.Errorf("update status of Service %s/%s: %w", svc.Namespace, svc.Name, err)
	}
	return nil
}

// poolConditions returns the pool's conditions as the outcome wants them.
func poolConditions(p *ciliumv2.CiliumLoadBalancerIPPool, o PoolOutcome) []metav1.Condition {
	conds := slices.Clone(p.Status.Conditions)
	set := func(t string, s metav1.ConditionStatus, reason, msg string) {
		meta.SetStatusCondition(&conds, metav1.Condition{Type: t, Status: s, ObservedGeneration: p.Generation, Reason: reason, Message: msg})
	}
	set(ciliumv2.PoolIPsTotalCondition, metav1.ConditionUnknown, reasonCountsNoReason, strconv.FormatUint(o.Total, 10))
	set(ciliumv2.PoolIPsAvailableCondition, metav1.ConditionUnknown, reasonCountsNoReason, strconv.FormatUint(o.Available, 10))
	set(ciliumv2.PoolIPsUsedCondition, metav1.ConditionUnknown, reasonCountsNoReason, strconv.FormatUint(o.Used, 10))
	if o.Conflict != "" {
		set(ciliumv2.PoolConflictCondition, metav1.ConditionTrue, reasonCIDROverlap, o.Conflict)
	} else {
		set(ciliumv2.PoolConflictCondition, metav1.ConditionFalse, reasonResolved, "")
	}
	switch {
	case o.PodCIDROverlap != "":
		set(ciliumv2.PoolPodCIDRConflictCondition, metav1.ConditionTrue, reasonPodCIDROverlap, o.PodCIDROverlap)
	case meta.FindStatusCondition(conds, ciliumv2.PoolPodCIDRConflictCondition) != nil:
		set(ciliumv2.PoolPodCIDRConflictCondition, metav1.ConditionFalse, reasonResolved, "")
	}
	return conds
}

// writePool sets the pool's conditions, unless they already are.
func (c *Controller) writePool(ctx context.Context, o PoolOutcome) error {
	first := true
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := o.Pool
		if !first {
			var err error
			if cur, err = c.pools.Get(ctx, o.Pool.Name, metav1.GetOptions{}); err != nil {
				return err
			}
		}
		first = false
		want := poolConditions(cur, o)
		if equality.Semantic.DeepEqual(cur.Status.Conditions, want) {
			return nil
		}
		next := cur.DeepCopy()
		next.Status.Conditions = want
		_, err := c.pools.UpdateStatus(ctx, next, metav1.UpdateOptions{FieldManager: eventSource})
		return err
	})
	if err != nil && !k8serrors.IsNotFound(err) {
		return fmt.Errorf("update status of CiliumLoadBalancerIPPool %s: %w", o.Pool.Name, err)
	}
	return nil
}

// event records a Warning Event about a pool (cluster-scoped objects'
// Events go to the default namespace, as client-go's recorder does).
func (c *Controller) event(ctx context.Context, p *ciliumv2.CiliumLoadBalancerIPPool, msg string) error {
	now := metav1.Now()
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{
			Name:      fmt.Sprintf("%s.%x", p.Name, now.UnixNano()),
			Namespace: metav1.NamespaceDefault,
		},
		InvolvedObject: corev1.ObjectReference{
			APIVersion: ciliumv2.SchemeGroupVersion.String(), Kind: "CiliumLoadBalancerIPPool",
			Name: p.Name, UID: p.UID, ResourceVersion: p.ResourceVersion,
		},
		Reason: eventReasonPodCIDROverlap, Message: msg, Type: corev1.EventTypeWarning,
		Source:         corev1.EventSource{Component: eventSource},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
		ReportingController: eventSource,
	}
	_, err := c.core.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, ev, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create Event about CiliumLoadBalancerIPPool %s: %w", p.Name, err)
	}
	return nil
}

// report sets the health from a pass.
func (c *Controller) report(out Outcome, failed int) {
	if failed > 0 {
		c.health.Degraded("writing statuses", fmt.Errorf("%d writes failed; retrying", failed))
		return
	}
	sat, unsat := 0, 0
	for _, o := range out.Services {
		switch {
		case !o.Responsible:
		case o.Satisfied:
			sat++
		default:
			unsat++
		}
	}
	c.health.OK(fmt.Sprintf("%d pools; %d Services with their addresses, %d waiting", len(out.Pools), sat, unsat))
}
