package endpointgc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"
	k8serrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	ciliumclient "github.com/cellium/cellium/api/client/clientset/versioned/typed/cilium.io/v2"
	"github.com/cellium/cellium/cells/hive"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/tables"
)

// HealthEndpointPrefix starts the name of a node's health endpoint
// CiliumEndpoint, cilium-health-<node>. It has no pod; it lives as long as
// the CiliumNode <node>.
const HealthEndpointPrefix = "cilium-health-"

// Tables are what the collector decides from. Each must be initialized
// (fully listed) before the collector acts.
type Tables struct {
	DB        *statedb.DB
	Pods      statedb.Table[*corev1.Pod]
	Endpoints statedb.Table[*ciliumv2.CiliumEndpoint]
	Nodes     statedb.Table[*ciliumv2.CiliumNode]
}

// GC deletes CiliumEndpoints that stand for no live pod. It is the body of
// the cell's leader job; NewGC makes one without a hive.
type GC struct {
	interval time.Duration
	client   ciliumclient.CiliumEndpointsGetter
	tables   Tables
	log      *slog.Logger
	health   hive.Health
	now      func() time.Time
}

// NewGC returns a collector that runs every interval (which must be
// positive) and deletes through client.
func NewGC(interval time.Duration, client ciliumclient.CiliumEndpointsGetter, tables Tables, log *slog.Logger, health hive.Health) *GC {
	return &GC{interval: interval, client: client, tables: tables, log: log, health: health, now: time.Now}
}

// Run waits until the pods, CiliumEndpoints and CiliumNodes tables are
// initialized, runs a pass at once and then one every interval, until ctx
// is cancelled. It returns nil.
func (g *GC) Run(ctx context.Context) error {
	defer g.health.Stopped("not leading")
	g.health.OK("waiting for the pods, CiliumEndpoints and CiliumNodes tables")
	if err := tables.WaitInitialized(ctx, g.tables.DB, g.tables.Pods, g.tables.Endpoints, g.tables.Nodes); err != nil {
		return nil // cancelled
	}
	ticker := time.NewTicker(g.interval)
	defer ticker.Stop()
	for {
		res := g.Pass(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if res.Err != nil {
			g.log.Error("CiliumEndpoint GC pass failed", "deleted", res.Deleted, "failed", res.Failed, "error", res.Err)
			g.health.Degraded("deleting stale CiliumEndpoints", res.Err)
		} else {
			g.health.OK(fmt.Sprintf("last pass at %s: %d checked, %d deleted", g.now().Format(time.RFC3339), res.Checked, res.Deleted))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

// PassResult counts what one pass did.
type PassResult struct {
	// Checked is how many CiliumEndpoints were looked at.
	Checked int
	// Deleted is how many were deleted.
	Deleted int
	// Failed is how many deletions failed; Err joins their errors.
	Failed int
	Err    error
}

// Pass looks at every CiliumEndpoint once and deletes the stale ones. The
// caller must have waited for the tables to be initialized (Run does). A
// CiliumEndpoint that is gone or was re-created (another UID) by the time
// of the delete is left alone and not counted.
func (g *GC) Pass(ctx context.Context) PassResult {
	txn := g.tables.DB.ReadTxn()
	look := tableLookups{txn: txn, tables: g.tables}
	now := g.now()
	var (
		res  PassResult
		errs []error
	)
	for cep := range g.tables.Endpoints.All(txn) {
		if ctx.Err() != nil {
			break
		}
		res.Checked++
		del, reason := decide(cep, now, g.interval, look)
		if !del {
			continue
		}
		uid := cep.UID
		background := metav1.DeletePropagationBackground
		err := g.client.CiliumEndpoints(cep.Namespace).Delete(ctx, cep.Name, metav1.DeleteOptions{
			Preconditions:     &metav1.Preconditions{UID: &uid},
			PropagationPolicy: &background,
		})
		switch {
		case err == nil:
			res.Deleted++
			g.log.Info("deleted stale CiliumEndpoint", "ciliumendpoint", k8stables.Key(cep), "reason", reason)
		case k8serrors.IsNotFound(err) || k8serrors.IsConflict(err):
			// Already gone, or re-created since the table saw it.
			g.log.Debug("CiliumEndpoint gone or re-created, not deleted", "ciliumendpoint", k8stables.Key(cep), "error", err)
		default:
			res.Failed++
			errs = append(errs, fmt.Errorf("delete CiliumEndpoint %s: %w", k8stables.Key(cep), err))
		}
	}
	res.Err = errors.Join(errs...)
	return res
}

// lookups answer decide's questions about pods and nodes.
type lookups interface {
	pod(namespace, name string) (*corev1.Pod, bool)
	nodeExists(name string) bool
}

type tableLookups struct {
	txn    statedb.ReadTxn
	tables Tables
}

func (l tableLookups) pod(namespace, name string) (*corev1.Pod, bool) {
	p, _, ok := l.tables.Pods.Get(l.txn, k8stables.NameIndex[*corev1.Pod]().Query(namespace+"/"+name))
	return p, ok
}

func (l tableLookups) nodeExists(name string) bool {
	_, _, ok := l.tables.Nodes.Get(l.txn, k8stables.NameIndex[*ciliumv2.CiliumNode]().Query(name))
	return ok
}

// decide says whether a CiliumEndpoint is stale, and why (or why not).
//
//   - Younger than minAge: kept (its pod may not have reached the table).
//   - Owned by pods: deleted only when none of them is live; a pod is live
//     when it exists with the owner reference's UID and has not finished.
//   - cilium-health-<node> without a pod owner and without a pod of that
//     name: kept while the CiliumNode <node> exists.
//   - Owned only by other kinds of objects: kept.
//   - No owner: the pod with the CiliumEndpoint's name must be live.
func decide(cep *ciliumv2.CiliumEndpoint, now time.Time, minAge time.Duration, l lookups) (bool, string) {
	if age := now.Sub(cep.CreationTimestamp.Time); age < minAge {
		return false, fmt.Sprintf("created %s ago, less than one GC interval", age.Truncate(time.Millisecond))
	}
	var (
		podOwners   []metav1.OwnerReference
		otherOwners []string
	)
	for _, o := range cep.OwnerReferences {
		if o.Kind == "Pod" {
			podOwners = append(podOwners, o)
		} else {
			otherOwners = append(otherOwners, o.Kind+"/"+o.Name)
		}
	}
	if len(podOwners) == 0 && strings.HasPrefix(cep.Name, HealthEndpointPrefix) {
		if _, isPod := l.pod(cep.Namespace, cep.Name); !isPod {
			node := strings.TrimPrefix(cep.Name, HealthEndpointPrefix)
			if l.nodeExists(node) {
				return false, "health endpoint of CiliumNode " + node
			}
			return true, fmt.Sprintf("health endpoint of CiliumNode %s, which is gone", node)
		}
	}
	if len(podOwners) == 0 {
		if len(otherOwners) > 0 {
			return false, "owned by " + strings.Join(otherOwners, ", ")
		}
		return stalePod(l, cep.Namespace, cep.Name, "")
	}
	var reasons []string
	for _, o := range podOwners {
		stale, reason := stalePod(l, cep.Namespace, o.Name, o.UID)
		if !stale {
			return false, reason
		}
		reasons = append(reasons, reason)
	}
	return true, strings.Join(reasons, "; ")
}

// stalePod says whether the pod namespace/name is not live; uid, when set,
// is the UID the pod must have.
func stalePod(l lookups, namespace, name string, uid types.UID) (bool, string) {
	pod, ok := l.pod(namespace, name)
	switch {
	case !ok:
		return true, fmt.Sprintf("pod %s/%s is gone", namespace, name)
	case uid != "" && pod.UID != uid:
		return true, fmt.Sprintf("pod %s/%s is another pod (UID %s, the owner was %s)", namespace, name, pod.UID, uid)
	case pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed:
		return true, fmt.Sprintf("pod %s/%s has finished (%s)", namespace, name, pod.Status.Phase)
	}
	return false, fmt.Sprintf("pod %s/%s is live", namespace, name)
}
