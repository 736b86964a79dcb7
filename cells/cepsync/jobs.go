package cepsync

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"time"

	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/reconcilejob"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/statedb/bpfprog"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/identity"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/nodes"
	statepolicy "github.com/cellium/cellium/statedb/policy"
	"github.com/cellium/cellium/statedb/reconciler"
	"github.com/cellium/cellium/statedb/tables"
)

// FullInterval is how often every CEP is checked again (recreating one
// deleted behind the agent's back) and stale ones pruned.
const FullInterval = 30 * time.Second

// SettleMax is how long the CEP write of an endpoint between two resting
// states (waiting-to-regenerate, regenerating) waits for it to rest
// (ready, not-ready): a new pod's CEP is created once, ready, instead of
// created and then patched at each step; an endpoint stuck longer gets
// its CEP (or update) showing why.
const SettleMax = 3 * time.Second

// GCGrace is how long the CEP of a deleted endpoint whose pod is gone or
// terminating is left to Kubernetes' garbage collector (the CEP's
// ownerReference names the pod) before the agent deletes it itself: in a
// cluster with a collector the agent does not write at all, in one
// without (a bare API server) the CEP still goes.
const GCGrace = 5 * time.Second

// sweepInterval is how often the CEPs left to the garbage collector are
// checked.
const sweepInterval = time.Second

type jobsParams struct {
	hive.In
	Config    Config
	Log       *slog.Logger
	DB        *statedb.DB
	Desired   statedb.RWTable[*DesiredCEP]
	Endpoints statedb.Table[*endpoints.Endpoint]
	Pods      statedb.Table[*corev1.Pod]
	Policies  statedb.Table[*statepolicy.EndpointPolicyRow]
	// Programs is the eBPF loader's table, for .status.health.bpf
	// (absent without the loader: Disabled).
	Programs  statedb.Table[*bpfprog.Program] `optional:"true"`
	LocalNode statedb.Table[*nodes.LocalNode]
	CEPs      statedb.Table[*ciliumv2.CiliumEndpoint]
	Clientset k8s.Clientset
	Node      k8s.NodeName
	Jobs      hive.Jobs
	Reconcile reconcilejob.Params
}

func registerJobs(p jobsParams) error {
	if p.Config.DisableEndpointCRD {
		p.Log.Info("CiliumEndpoint synchronization disabled (--disable-endpoint-crd)")
		return nil
	}
	nodeIP := func() string { ip, _ := nodes.LocalInternalIP(p.DB.ReadTxn(), p.LocalNode, string(p.Node)); return ip }
	txn := p.DB.WriteTxn(p.Desired)
	initDone := p.Desired.RegisterInitializer(txn, "endpoints")
	txn.Commit()

	d := &deriver{p: p, init: tables.NewInitGate(initDone), now: time.Now}
	tgt := &target{
		log: p.Log, client: p.Clientset.Cilium(), db: p.DB, ceps: p.CEPs, nodeIP: nodeIP,
		healthName: "cilium-health-" + string(p.Node), uids: map[string]types.UID{},
		endpoints: p.Endpoints, pods: p.Pods, gcGrace: GCGrace, now: time.Now,
		orphans: map[string]orphan{},
	}
	// Its job is "reconcile-cilium-endpoints".
	_, err := reconcilejob.New(p.Reconcile, reconciler.Config[*DesiredCEP]{
		Name:      "cilium-endpoints",
		Table:     p.Desired,
		GetStatus: func(d *DesiredCEP) reconciler.Status { return d.Reconcile },
		SetStatus: func(d *DesiredCEP, s reconciler.Status) *DesiredCEP {
			c := *d
			c.Reconcile = s
			return &c
		},
		Operations:   tgt,
		FullInterval: FullInterval,
		RetryMin:     100 * time.Millisecond,
		RetryMax:     10 * time.Second,
	}, nil)
	if err != nil {
		return err
	}
	p.Jobs.Add(hive.Service("derive-desired-ceps", d.subscribe, d.run),
		hive.Timer("sweep-orphaned-ceps", tgt.sweepOrphans, sweepInterval))
	return nil
}

// deriver turns endpoints into desired CEPs. It re-derives an endpoint's
// CEP when the endpoint, its pod's labels, its computed policy or the node
// IP change.
type deriver struct {
	p        jobsParams
	init     tables.InitGate
	now      func() time.Time
	eps      statedb.ChangeIterator[*endpoints.Endpoint]
	pods     statedb.ChangeIterator[*corev1.Pod]
	policies statedb.ChangeIterator[*statepolicy.EndpointPolicyRow]
}

func (d *deriver) subscribe() error {
	txn := d.p.DB.WriteTxn(d.p.Endpoints, d.p.Pods, d.p.Policies)
	defer txn.Commit()
	var err error
	if d.eps, err = d.p.Endpoints.Changes(txn); err != nil {
		return err
	}
	if d.policies, err = d.p.Policies.Changes(txn); err != nil {
		return err
	}
	d.pods, err = d.p.Pods.Changes(txn)
	return err
}

func (d *deriver) run(ctx context.Context, h hive.Health) {
	defer d.eps.Close()
	defer d.pods.Close()
	defer d.policies.Close()
	lastNodeIP := ""
	// What a failed write leaves in touched and deleted is retried on the
	// next change.
	touched := map[uint16]bool{}
	deleted := map[string]uint16{}
	// held are the endpoints whose CEP write waits for them to settle,
	// until when at the latest.
	held := map[uint16]time.Time{}
	for {
		for id := range held {
			touched[id] = true
		}
		rtxn := d.p.DB.ReadTxn()
		epChanges, epWatch := d.eps.Next(rtxn)
		for c := range epChanges {
			if c.Deleted {
				deleted[c.Object.CEPKey()] = c.Object.ID
			} else {
				touched[c.Object.ID] = true
			}
		}
		podChanges, podWatch := d.pods.Next(rtxn)
		for c := range podChanges {
			for ep := range d.p.Endpoints.List(rtxn, endpoints.PodIndex.Query(c.Object.Namespace+"/"+c.Object.Name)) {
				touched[ep.ID] = true
			}
		}
		polChanges, polWatch := d.policies.Next(rtxn)
		for c := range polChanges {
			touched[c.Object.EndpointID] = true
		}
		ip, nodeWatch := nodes.LocalInternalIP(rtxn, d.p.LocalNode, string(d.p.Node))
		if ip != lastNodeIP {
			lastNodeIP = ip
			for ep := range d.p.Endpoints.All(rtxn) {
				touched[ep.ID] = true
			}
		}
		held = map[uint16]time.Time{}
		if err := d.apply(rtxn, touched, deleted, held, lastNodeIP); err != nil {
			d.p.Log.Error("Writing the desired CEPs failed", "error", err)
			h.Degraded("write the desired CEPs", err)
		} else {
			touched = map[uint16]bool{}
			deleted = map[string]uint16{}
			h.OK("in sync")
		}
		var settled <-chan time.Time
		if len(held) > 0 {
			next := time.Time{}
			for _, at := range held {
				if next.IsZero() || at.Before(next) {
					next = at
				}
			}
			// A timer nobody stops is collected once it fires (Go 1.23).
			settled = time.After(max(next.Sub(d.now()), 10*time.Millisecond))
		}
		select {
		case <-ctx.Done():
			return
		case <-settled:
		case <-epWatch:
		case <-podWatch:
		case <-polWatch:
		case <-nodeWatch:
		}
	}
}

// apply writes the desired rows of the touched endpoints and removes the
// rows of deleted ones. Unchanged rows are not rewritten. A failed write
// aborts the transaction and is returned.
func (d *deriver) apply(rtxn statedb.ReadTxn, touched map[uint16]bool, deleted map[string]uint16, held map[uint16]time.Time, nodeIP string) error {
	txn := d.p.DB.WriteTxn(d.p.Desired)
	if err := d.write(rtxn, txn, touched, deleted, held, nodeIP); err != nil {
		txn.Abort()
		return err
	}
	if d.init.Closed() {
		if ok, _ := d.p.Endpoints.Initialized(rtxn); ok {
			d.init.Open(txn)
		}
	}
	txn.Commit()
	return nil
}

// write is apply's part in txn. The endpoints whose write waits for them
// to settle are added to held, with the time they are written anyway.
func (d *deriver) write(rtxn statedb.ReadTxn, txn statedb.WriteTxn, touched map[uint16]bool, deleted map[string]uint16, held map[uint16]time.Time, nodeIP string) error {
	now := d.now()
	for key, id := range deleted {
		cur, _, ok := d.p.Desired.Get(txn, DesiredKeyIndex.Query(key))
		if ok && cur.EndpointID == id {
			if _, _, err := d.p.Desired.Delete(txn, cur); err != nil {
				return fmt.Errorf("delete desired CEP %s: %w", key, err)
			}
		}
	}
	for id := range touched {
		ep, _, ok := d.p.Endpoints.Get(rtxn, endpoints.IDIndex.Query(id))
		if !ok {
			continue
		}
		want := d.desired(rtxn, ep, nodeIP)
		if until, ok := settling(ep, now); ok && want != nil {
			held[id] = until
			continue
		}
		cur, _, exists := d.p.Desired.Get(txn, DesiredKeyIndex.Query(ep.CEPKey()))
		switch {
		case want == nil:
			if exists && cur.EndpointID == ep.ID && ep.State != ciliumv2.EndpointStateRestoring {
				if _, _, err := d.p.Desired.Delete(txn, cur); err != nil {
					return fmt.Errorf("delete desired CEP %s: %w", ep.CEPKey(), err)
				}
			}
		case exists && cur.sameAs(want) && cur.Reconcile.Kind != reconciler.StatusPendingDelete:
			// Identical: no write, no API call.
		default:
			want.Reconcile = reconciler.Pending()
			if _, _, err := d.p.Desired.Insert(txn, want); err != nil {
				return fmt.Errorf("insert desired CEP %s: %w", ep.CEPKey(), err)
			}
		}
	}
	return nil
}

// settling reports whether ep is between two resting states (its policy
// is being computed or taken) for less than SettleMax, and until when:
// its CEP is written when it rests, or then. The time it entered its
// state is its last log entry's (a second's precision), or its creation.
func settling(ep *endpoints.Endpoint, now time.Time) (time.Time, bool) {
	if ep.State != ciliumv2.EndpointStateWaitingToRegenerate && ep.State != ciliumv2.EndpointStateRegenerating {
		return time.Time{}, false
	}
	since := ep.Created
	if n := len(ep.Log); n > 0 && ep.Log[n-1].State == string(ep.State) {
		if ts, err := time.Parse(time.RFC3339, ep.Log[n-1].Timestamp); err == nil && ts.After(since) {
			since = ts
		}
	}
	until := since.Add(SettleMax)
	return until, now.Before(until)
}

// desired is the CEP of ep, or nil when it should have none (yet): no
// identity yet, no pod to own it, or no node IP known.
func (d *deriver) desired(rtxn statedb.ReadTxn, ep *endpoints.Endpoint, nodeIP string) *DesiredCEP {
	if ep.Identity == identity.InvalidIdentity || nodeIP == "" || ep.State == ciliumv2.EndpointStateDisconnecting {
		return nil
	}
	out := &DesiredCEP{
		Namespace: ep.CEPNamespace, Name: ep.CEPName, EndpointID: ep.ID,
		PodName: ep.PodName, PodUID: ep.PodUID, Health: ep.Health,
		Status: ep.Status(nodeIP),
	}
	out.Status.Policy = statepolicy.EndpointStatus(rtxn, d.p.Policies, ep.ID, ep.Identity)
	out.Status.Health.Bpf = bpfprog.Health(rtxn, d.p.Programs, ep)
	if !ep.Health {
		pod, _, ok := d.p.Pods.Get(rtxn, k8stables.NameIndex[*corev1.Pod]().Query(ep.PodKey()))
		if !ok || string(pod.UID) != ep.PodUID {
			return nil // no owner: no CEP (Cilium does the same)
		}
		if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			// A finished pod has no network: the operator deletes its
			// CEP, and a restored endpoint of it must not bring it back.
			return nil
		}
		out.Labels = maps.Clone(pod.Labels)
	}
	return out
}
