package benchdatapath

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"time"

	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	api "github.com/cellium/cellium/api/policy"
	"github.com/cellium/cellium/cells/endpointpolicy"
	"github.com/cellium/cellium/cells/hive"
	ipcachecell "github.com/cellium/cellium/cells/ipcache"
	"github.com/cellium/cellium/daemon/bpfmaps"
	"github.com/cellium/cellium/statedb/endpoints"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/labels"
	"github.com/cellium/cellium/statedb/mapstate"
	"github.com/cellium/cellium/statedb/nodes"
	"github.com/cellium/cellium/statedb/policy"
	"github.com/cellium/cellium/statedb/reconciler"
)

// benchNamespace is the namespace of the bench's pods and policies (they
// exist only in the agent's tables, never in an apiserver).
const benchNamespace = "benchdp"

// agent is the agent's policy path as cellium-agent composes it: the
// policy cell (endpointpolicy.Cell: CNP table -> policy engine ->
// endpoint-policies table), the ipcache cell, and the BPF map cell
// (daemon/bpfmaps: deriver and reconcilers into the maps pinned under
// --bpf-root, the bench's private bpffs). The tables the apiserver
// reflectors, the endpoint manager and node discovery fill in the agent
// are written here by the bench: a policy change is a CNP row written as
// the CNP reflector writes it on a watch event.
type agent struct {
	h       *hive.Hive
	started bool
	db      *statedb.DB
	eps     statedb.RWTable[*endpoints.Endpoint]
	ids     statedb.RWTable[*ciliumv2.CiliumIdentity]
	cnps    statedb.RWTable[*ciliumv2.CiliumNetworkPolicy]
	local   statedb.RWTable[*nodes.LocalNode]
	pmaps   statedb.Table[*mapstate.PolicyMap]
}

func capture[T any](dst *T) hive.Cell { return hive.Invoke(func(v T) { *dst = v }) }

// newAgent builds the agent's cells on bpfRoot (maps pinned in
// bpfRoot/cellium) with log lines at warning and above going to logw;
// adopt starts them.
func newAgent(bpfRoot string, logw io.Writer) (*agent, error) {
	a := &agent{}
	h := hive.NewWithOptions(hive.Options{
		Logger:    slog.New(slog.NewTextHandler(logw, &slog.HandlerOptions{Level: slog.LevelWarn})),
		LookupEnv: func(string) (string, bool) { return "", false },
	},
		// Stand-ins for the tables of the k8s reflectors, the endpoint
		// manager and node discovery.
		hive.Provide(endpoints.NewTable, nodes.NewLocalNodeTable, nodes.NewNodesTable,
			k8stables.NewNetworkPoliciesTable, k8stables.NewCNPsTable, k8stables.NewCCNPsTable,
			k8stables.NewCiliumIdentitiesTable, k8stables.NewPodsTable, k8stables.NewCiliumEndpointsTable,
			statedb.RWTable[*endpoints.Endpoint].ToTable, statedb.RWTable[*nodes.LocalNode].ToTable,
			statedb.RWTable[*nodes.Node].ToTable, statedb.RWTable[*networkingv1.NetworkPolicy].ToTable,
			statedb.RWTable[*ciliumv2.CiliumNetworkPolicy].ToTable, statedb.RWTable[*ciliumv2.CiliumClusterwideNetworkPolicy].ToTable,
			statedb.RWTable[*ciliumv2.CiliumIdentity].ToTable, statedb.RWTable[*corev1.Pod].ToTable,
			statedb.RWTable[*ciliumv2.CiliumEndpoint].ToTable),
		endpointpolicy.Cell, ipcachecell.Cell, bpfmaps.Cell,
		capture(&a.db), capture(&a.eps), capture(&a.ids), capture(&a.cnps), capture(&a.local), capture(&a.pmaps),
	)
	if err := h.Flags().Parse([]string{"--enable-bpf-datapath", "--bpf-root=" + bpfRoot}); err != nil {
		return nil, err
	}
	if err := h.Populate(); err != nil {
		return nil, fmt.Errorf("build the agent's cells: %w", err)
	}
	a.h = h
	return a, nil
}

func (a *agent) stop() error {
	if !a.started {
		return nil
	}
	return a.h.Stop(context.Background())
}

// podLabels are the security labels of a bench pod with app=name.
func podLabels(name string) labels.Labels {
	all := labels.FromK8sPod(map[string]string{"app": name}, benchNamespace,
		map[string]string{"kubernetes.io/metadata.name": benchNamespace}, "", "")
	l, _ := labels.DefaultFilter().Split(all)
	return l
}

func ptr[T any](v T) *T { return &v }

func appSelector(name string) api.EndpointSelector {
	return api.EndpointSelector{MatchLabels: map[string]string{"app": name}}
}

// baseCNP lets pod a reach pod b on every port: b's ingress enforces.
func baseCNP() *ciliumv2.CiliumNetworkPolicy {
	return &ciliumv2.CiliumNetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "b-from-a", Namespace: benchNamespace},
		Spec: &api.Rule{EndpointSelector: ptr(appSelector("b")), Ingress: []api.IngressRule{{
			IngressCommonRule: api.IngressCommonRule{FromEndpoints: []api.EndpointSelector{appSelector("a")}},
		}}},
	}
}

// denyCNP denies pod a the stream's port on pod b.
func denyCNP() *ciliumv2.CiliumNetworkPolicy {
	return &ciliumv2.CiliumNetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "b-deny-stream", Namespace: benchNamespace},
		Spec: &api.Rule{EndpointSelector: ptr(appSelector("b")), IngressDeny: []api.IngressDenyRule{{
			IngressCommonRule: api.IngressCommonRule{FromEndpoints: []api.EndpointSelector{appSelector("a")}},
			ToPorts:           api.PortDenyRules{{Ports: []api.PortProtocol{{Port: strconv.Itoa(streamPort), Protocol: api.ProtoUDP}}}},
		}}},
	}
}

// adopt hands the bench's pods to the agent: their identities, endpoints,
// the node's router IP and the base policy go into the tables, the agent
// starts, and adopt returns once both pods' policy maps hold the agent's
// policy (which replaces what the bench wrote into them). The rows are
// there before the start, as the restored endpoints are in the agent: the
// reconciler's first prune would otherwise unpin the maps of endpoints it
// does not know, and the programs would keep reading the unpinned ones.
func (a *agent) adopt(ctx context.Context, t *topology) error {
	txn := a.db.WriteTxn(a.eps, a.ids, a.cnps, a.local)
	_, _, _ = a.local.Insert(txn, &nodes.LocalNode{Name: "benchdp", RouterIP: routerIP})
	for _, p := range []*pod{t.a, t.b} {
		lbls := podLabels(p.name)
		_, _, _ = a.ids.Insert(txn, &ciliumv2.CiliumIdentity{
			ObjectMeta:     metav1.ObjectMeta{Name: strconv.FormatUint(uint64(p.id), 10)},
			SecurityLabels: lbls.Map(),
		})
		_, _, _ = a.eps.Insert(txn, &endpoints.Endpoint{
			ID: p.epID, PodNamespace: benchNamespace, PodName: p.name, CEPNamespace: benchNamespace, CEPName: p.name,
			HostIfName: p.res.HostIfName, HostIfIndex: p.res.HostIfIndex, MAC: p.res.PodMAC.String(), HostMAC: p.res.HostMAC.String(),
			IPv4: p.ip, Labels: lbls, Identity: p.id, State: ciliumv2.EndpointStateReady,
		})
	}
	_, _, _ = a.cnps.Insert(txn, baseCNP())
	txn.Commit()
	if err := a.h.Start(ctx); err != nil {
		return fmt.Errorf("start the agent's cells: %w", err)
	}
	a.started = true
	for _, p := range []*pod{t.a, t.b} {
		if _, err := a.waitPolicy(ctx, p.epID, func(*policy.EndpointPolicy) bool { return true }, 30*time.Second); err != nil {
			return fmt.Errorf("pod %s's policy map: %w", p.name, err)
		}
	}
	return nil
}

// waitPolicy waits until the policy-maps row of endpoint ep says the map
// holds the policy it desires and that policy satisfies ok; it returns
// when that was seen.
func (a *agent) waitPolicy(ctx context.Context, ep uint16, ok func(*policy.EndpointPolicy) bool, timeout time.Duration) (time.Time, error) {
	deadline := time.After(timeout)
	var last *mapstate.PolicyMap
	for {
		txn := a.db.ReadTxn()
		row, _, watch, found := a.pmaps.GetWatch(txn, mapstate.PolicyEndpointIndex.Query(ep))
		if found {
			last = row
			if row.Status.Kind == reconciler.StatusDone && row.Realized == row.Revision && row.Policy != nil && ok(row.Policy) {
				return time.Now(), nil
			}
		}
		select {
		case <-watch:
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-deadline:
			return time.Time{}, fmt.Errorf("the agent did not realize the policy of endpoint %d within %v (policy-maps row %+v)", ep, timeout, last)
		}
	}
}

// agentEnforcer changes the policy through the agent: deny writes the
// deny CNP into the CNP table, allow deletes it. Both return once the
// agent's policy-maps row says b's map holds the change ("realized").
type agentEnforcer struct {
	a        *agent
	src, dst *pod
}

func (e *agentEnforcer) name() string {
	return "CNP written to the agent's CNP table -> policy engine -> policy-maps reconciler -> pinned map"
}

// streamDenied reports whether b's computed policy denies a the stream.
func (e *agentEnforcer) streamDenied(p *policy.EndpointPolicy) bool {
	allowed, _, _ := p.Ingress.Decide(e.src.id, policy.ProtoUDP, streamPort)
	return !allowed
}

func (e *agentEnforcer) deny(ctx context.Context) error {
	txn := e.a.db.WriteTxn(e.a.cnps)
	if _, _, err := e.a.cnps.Insert(txn, denyCNP()); err != nil {
		txn.Abort()
		return err
	}
	txn.Commit()
	_, err := e.a.waitPolicy(ctx, e.dst.epID, e.streamDenied, 10*time.Second)
	return err
}

func (e *agentEnforcer) allow(ctx context.Context) error {
	txn := e.a.db.WriteTxn(e.a.cnps)
	if _, _, err := e.a.cnps.Delete(txn, denyCNP()); err != nil {
		txn.Abort()
		return err
	}
	txn.Commit()
	_, err := e.a.waitPolicy(ctx, e.dst.epID, func(p *policy.EndpointPolicy) bool { return !e.streamDenied(p) }, 10*time.Second)
	return err
}
