package endpointmanager

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/hive"
	identitycell "github.com/cellium/cellium/cells/identity"
	"github.com/cellium/cellium/cells/ipam"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/cells/statedir"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/labels"
	statepolicy "github.com/cellium/cellium/statedb/policy"
)

type managerParams struct {
	hive.In
	Log        *slog.Logger
	DB         *statedb.DB
	Table      statedb.RWTable[*endpoints.Endpoint]
	Pods       statedb.Table[*corev1.Pod]
	Namespaces statedb.Table[*corev1.Namespace]
	Clientset  k8s.Clientset
	IPAM       ipam.Allocator
	Identities identitycell.Allocator
	Filter     identitycell.LabelFilter
	Cluster    identitycell.ClusterName
	StateDir   statedir.Dir
	Node       k8s.NodeName
	// CEPs lets restore rebuild an endpoint whose state file is unreadable.
	CEPs statedb.Table[*ciliumv2.CiliumEndpoint] `optional:"true"`
	// Policies, when the agent has a policy engine, is what an endpoint's
	// state follows once its identity is resolved.
	Policies statedb.Table[*statepolicy.EndpointPolicyRow] `optional:"true"`
}

func newManager(p managerParams) *Manager {
	return &Manager{
		log: p.Log, db: p.DB, table: p.Table, pods: p.Pods, namespaces: p.Namespaces,
		clientset: p.Clientset, ipam: p.IPAM, identities: p.Identities, filter: p.Filter,
		cluster: p.Cluster, store: store{dir: string(p.StateDir) + "/endpoints", now: time.Now}, node: p.Node, now: time.Now,
		ceps: p.CEPs, sysClassNet: "/sys/class/net", policies: p.Policies,
	}
}

type jobsParams struct {
	hive.In
	Manager   *Manager
	DB        *statedb.DB
	Table     statedb.RWTable[*endpoints.Endpoint]
	Pods      statedb.Table[*corev1.Pod]
	StateDir  statedir.Dir
	Lifecycle hive.Lifecycle
	Jobs      hive.Jobs
	Lookup    ipam.Lookup
	Node      k8s.NodeName
}

func registerJobs(p jobsParams) {
	m := p.Manager
	// The table counts as initialized once restore has decided about every
	// saved endpoint: the CEP synchronizer prunes stale CEPs only then.
	txn := p.DB.WriteTxn(p.Table)
	restoreDone := p.Table.RegisterInitializer(txn, "endpoint-restore")
	txn.Commit()

	// IPAM hands out no address before it holds those of the restored
	// endpoints (released at once if loading fails: start-up stops then).
	handOver := m.ipam.HoldForRestore("endpoint-manager")
	var restored []*endpoints.Endpoint
	p.Lifecycle.Append(hive.Hook{
		Name: "endpoint-restore-load",
		OnStart: func(context.Context) (err error) {
			defer func() { handOver(restoredClaims(restored)) }()
			if _, err := p.StateDir.Sub("endpoints"); err != nil {
				return err
			}
			restored, err = m.loadRestored()
			return err
		},
	})
	p.Jobs.Add(
		hive.OneShot("endpoint-restore", func(ctx context.Context, _ hive.Health) error {
			return m.validateRestored(ctx, restored, restoreDone)
		}),
		// Pod label changes move endpoints to the matching identity.
		hive.ObserveTable("pod-labels", p.DB, p.Pods, func(ctx context.Context, c statedb.Change[*corev1.Pod]) error {
			if c.Deleted {
				return nil
			}
			for ep := range p.Table.List(p.DB.ReadTxn(), endpoints.PodIndex.Query(c.Object.Namespace+"/"+c.Object.Name)) {
				if !ep.InService() || string(c.Object.UID) != ep.PodUID {
					continue
				}
				if _, err := m.relabel(ctx, ep, nil, false); err != nil {
					return fmt.Errorf("relabel endpoint %d: %w", ep.ID, err)
				}
			}
			return nil
		}),
		// Endpoints that failed (identity, ...) are retried with backoff;
		// the module is degraded while any is stuck.
		hive.Service("retry-stuck-endpoints", nil, (&retrier{m: m, min: RetryMin, max: RetryMax, retry: m.retryEndpoint}).run),
		hive.OneShot("health-endpoint", func(ctx context.Context, h hive.Health) error {
			return m.ensureHealthEndpoint(ctx, p.Lookup, h)
		}, hive.WithRetry(-1, time.Second, 30*time.Second)),
	)
	if m.policies != nil {
		// Endpoint states follow their policy (state.go).
		d := &deriveStates{m: m}
		p.Jobs.Add(hive.Service("derive-endpoint-states", d.subscribe, d.run))
	}
}

// ensureHealthEndpoint creates the node's health endpoint,
// cilium-health-<node>, with the health IP that node discovery allocated
// and the reserved health identity. Its CEP lives in kube-system.
func (m *Manager) ensureHealthEndpoint(ctx context.Context, lookup ipam.Lookup, h hive.Health) error {
	h.OK("waiting for the node's health IP")
	ips, err := lookup.OwnedBy(ctx, HealthIPOwner)
	if err != nil {
		return fmt.Errorf("health endpoint IP: %w", err)
	}
	if len(ips) == 0 {
		return fmt.Errorf("health endpoint IP: no address allocated to %q yet", HealthIPOwner)
	}
	name := "cilium-health-" + string(m.node)
	for ep := range m.table.List(m.db.ReadTxn(), endpoints.CEPIndex.Query(HealthEndpointNamespace+"/"+name)) {
		if ep.Health {
			return nil
		}
	}
	ep := &endpoints.Endpoint{
		CEPNamespace: HealthEndpointNamespace, CEPName: name, Health: true,
		IPv4: ips[0], Labels: labels.New(labels.Reserved(labels.IDNameHealth)), Created: m.now(),
	}
	ep, _, err = m.insertNew(ep)
	if err != nil {
		return err
	}
	if _, err := m.resolveIdentity(ctx, ep); err != nil {
		m.remove(ctx, ep, false)
		return err
	}
	h.OK(fmt.Sprintf("health endpoint %d (%s) ready", ep.ID, ep.IPv4))
	return nil
}

// HealthIPOwner is the IPAM owner of the node's health IP, allocated by
// node discovery.
const HealthIPOwner = ipam.HealthOwner
