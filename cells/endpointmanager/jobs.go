package endpointmanager

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/hive"
	identitycell "github.com/cellium/cellium/cells/identity"

	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/cells/statedir"
	"github.com/cellium/cellium/statedb/bpfprog"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/health"
	"github.com/cellium/cellium/statedb/identity"
	ipamtables "github.com/cellium/cellium/statedb/ipam"
	"github.com/cellium/cellium/statedb/labels"
	"github.com/cellium/cellium/statedb/mapstate"
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
	// IPAMRequests is the IPAM requests table (cell.go).
	IPAMRequests statedb.RWTable[*ipamtables.Request]
	// Requests is the identity requests table (cell.go).
	Requests statedb.RWTable[*identity.Request]
	Filter   identitycell.LabelFilter
	Cluster  identitycell.ClusterName
	StateDir statedir.Dir
	Node     k8s.NodeName
	// CEPs lets restore rebuild an endpoint whose state file is unreadable.
	CEPs statedb.Table[*ciliumv2.CiliumEndpoint] `optional:"true"`
	// Programs is the eBPF loader's table (absent without the loader):
	// endpoints are ready once their programs are attached.
	Programs statedb.Table[*bpfprog.Program] `optional:"true"`
	// Policies, when the agent has a policy engine, is what an endpoint's
	// state follows once its identity is resolved.
	Policies statedb.Table[*statepolicy.EndpointPolicyRow] `optional:"true"`
	// PolicyMaps is the BPF map reconcilers' policy-maps table (absent
	// without them): endpoints are ready once their policy map holds the
	// revision they take.
	PolicyMaps statedb.Table[*mapstate.PolicyMap] `optional:"true"`
}

func newManager(p managerParams) *Manager {
	return &Manager{
		log: p.Log, db: p.DB, table: p.Table, pods: p.Pods, namespaces: p.Namespaces,
		clientset: p.Clientset, ipamReqs: p.IPAMRequests, requests: p.Requests, filter: p.Filter,
		cluster: p.Cluster, store: store{dir: string(p.StateDir) + "/endpoints", now: time.Now}, node: p.Node, now: time.Now,
		ceps: p.CEPs, sysClassNet: "/sys/class/net", programs: p.Programs, policies: p.Policies, policyMaps: p.PolicyMaps,
	}
}

type jobsParams struct {
	hive.In
	Manager    *Manager
	DB         *statedb.DB
	Table      statedb.RWTable[*endpoints.Endpoint]
	Pods       statedb.Table[*corev1.Pod]
	Namespaces statedb.Table[*corev1.Namespace]
	StateDir   statedir.Dir
	Lifecycle  hive.Lifecycle
	Jobs       hive.Jobs
	// Allocations is IPAM's table: the health endpoint's address.
	Allocations statedb.Table[*ipamtables.Allocation]
	Node        k8s.NodeName
	// HealthInterfaces is the health endpoint's veth as the datapath made
	// it; absent when the agent has no health endpoint datapath.
	HealthInterfaces statedb.Table[*health.Interface] `optional:"true"`
}

func registerJobs(p jobsParams) {
	m := p.Manager
	// The table counts as initialized once restore has decided about every
	// saved endpoint: the CEP synchronizer prunes stale CEPs only then.
	txn := p.DB.WriteTxn(p.Table)
	restoreDone := p.Table.RegisterInitializer(txn, "endpoint-restore")
	txn.Commit()

	// IPAM hands out no address before the IPAM requests table is
	// initialized, with the addresses of the restored endpoints in it
	// (and without, at once, if loading fails: start-up stops then).
	txn = p.DB.WriteTxn(m.ipamReqs)
	holdsDone := m.ipamReqs.RegisterInitializer(txn, "endpoint-restore")
	txn.Commit()
	var restored []*endpoints.Endpoint
	p.Lifecycle.Append(hive.Hook{
		Name: "endpoint-restore-load",
		OnStart: func(context.Context) (err error) {
			defer func() {
				if herr := m.holdRestored(restored, holdsDone); herr != nil {
					m.log.Error("restored endpoints' addresses not held", "error", herr)
					txn := p.DB.WriteTxn(m.ipamReqs)
					holdsDone(txn)
					txn.Commit()
				}
			}()
			if _, err := p.StateDir.Sub("endpoints"); err != nil {
				return err
			}
			restored, err = m.loadRestored()
			return err
		},
	})
	if m.programs != nil {
		// Regenerating -> ready once the programs are attached; failed
		// loads into the endpoint's log.
		p.Jobs.Add(hive.Service("endpoint-programs", nil, m.followPrograms))
	}
	p.Jobs.Add(
		hive.OneShot("endpoint-restore", func(ctx context.Context, _ hive.Health) error {
			return m.validateRestored(ctx, restored, restoreDone)
		}),
		// The restored addresses' requests go once IPAM holds them.
		hive.OneShot("ipam-holds", func(ctx context.Context, _ hive.Health) error { return m.dropHolds(ctx) }),
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
		// Namespace label changes too: namespace labels are part of
		// every pod's identity (io.cilium.k8s.namespace.labels.*).
		hive.ObserveTable("namespace-labels", p.DB, p.Namespaces, func(ctx context.Context, c statedb.Change[*corev1.Namespace]) error {
			if c.Deleted {
				return nil
			}
			for ep := range p.Table.All(p.DB.ReadTxn()) {
				if ep.PodNamespace != c.Object.Name || !ep.InService() {
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
			return m.ensureHealthEndpoint(ctx, p.Allocations, h)
		}, hive.WithRetry(-1, time.Second, 30*time.Second)),
	)
	if p.HealthInterfaces != nil {
		// The health endpoint row gets the veth the datapath made, so
		// that routes (and programs) treat it like a pod's.
		p.Jobs.Add(hive.Service("health-endpoint-interface", nil, func(ctx context.Context, h hive.Health) {
			m.followHealthInterface(ctx, p.HealthInterfaces, h)
		}))
	}
	if m.policies != nil {
		// Endpoint states follow their policy (state.go).
		d := &deriveStates{m: m}
		p.Jobs.Add(hive.Service("derive-endpoint-states", d.subscribe, d.run))
	}
}

// followHealthInterface copies the health-interface row (or its absence)
// into the health endpoint row whenever either changes.
func (m *Manager) followHealthInterface(ctx context.Context, ifaces statedb.Table[*health.Interface], h hive.Health) {
	for {
		txn := m.db.ReadTxn()
		var iface *health.Interface
		rows, ifWatch := ifaces.AllWatch(txn)
		for r := range rows {
			iface = r
			break
		}
		var hep *endpoints.Endpoint
		eps, epWatch := m.table.AllWatch(txn)
		for ep := range eps {
			if ep.Health {
				hep = ep
				break
			}
		}
		if hep != nil {
			want := hep.Clone()
			want.HostIfName, want.HostIfIndex, want.MAC, want.HostMAC = "", 0, "", ""
			want.NetnsPath, want.ContainerID, want.ContainerIfName = "", "", ""
			if iface != nil && iface.IPv4 == hep.IPv4 {
				want.HostIfName, want.HostIfIndex, want.MAC, want.HostMAC = iface.HostIfName, iface.HostIfIndex, iface.MAC, iface.HostMAC
				want.NetnsPath, want.ContainerID, want.ContainerIfName = iface.NetnsPath, iface.ContainerID, iface.IfName
			}
			if sameInterface(want, hep) {
				h.OK("health endpoint interface " + orNone(hep.HostIfName))
			} else if err := m.modify(hep.ID, func(cur *endpoints.Endpoint) *endpoints.Endpoint {
				c := cur.Clone()
				c.HostIfName, c.HostIfIndex, c.MAC, c.HostMAC = want.HostIfName, want.HostIfIndex, want.MAC, want.HostMAC
				c.NetnsPath, c.ContainerID, c.ContainerIfName = want.NetnsPath, want.ContainerID, want.ContainerIfName
				return c
			}); err != nil {
				h.Degraded("record the health endpoint's interface", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-ifWatch:
		case <-epWatch:
		}
	}
}

func sameInterface(a, b *endpoints.Endpoint) bool {
	return a.HostIfName == b.HostIfName && a.HostIfIndex == b.HostIfIndex && a.MAC == b.MAC &&
		a.HostMAC == b.HostMAC && a.NetnsPath == b.NetnsPath && a.ContainerID == b.ContainerID && a.ContainerIfName == b.ContainerIfName
}

func orNone(s string) string {
	if s == "" {
		return "(none yet)"
	}
	return s
}

// ensureHealthEndpoint creates the node's health endpoint,
// cilium-health-<node>, with the health IP that node discovery allocated
// and the reserved health identity. Its CEP lives in kube-system.
func (m *Manager) ensureHealthEndpoint(ctx context.Context, allocs statedb.Table[*ipamtables.Allocation], h hive.Health) error {
	h.OK("waiting for the node's health IP")
	var ip netip.Addr
	for !ip.IsValid() {
		txn := m.db.ReadTxn()
		iter, watch := allocs.ListWatch(txn, ipamtables.OwnerIndex.Query(HealthIPOwner))
		for a := range iter {
			ip = a.IP
			break
		}
		if ip.IsValid() {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("health endpoint IP: no address allocated to %q yet: %w", HealthIPOwner, ctx.Err())
		case <-watch:
		}
	}
	name := "cilium-health-" + string(m.node)
	for ep := range m.table.List(m.db.ReadTxn(), endpoints.CEPIndex.Query(HealthEndpointNamespace+"/"+name)) {
		if ep.Health {
			return nil
		}
	}
	ep := &endpoints.Endpoint{
		CEPNamespace: HealthEndpointNamespace, CEPName: name, Health: true,
		IPv4: ip, Labels: labels.New(labels.Reserved(labels.IDNameHealth)), Created: m.now(),
	}
	ep, _, err := m.insertNew(ep)
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
const HealthIPOwner = ipamtables.HealthOwner
