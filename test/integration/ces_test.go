package integration

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/statedb"
	"go.uber.org/goleak"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/client/clientset/versioned"
	"github.com/cellium/cellium/cells/cesbatcher"
	"github.com/cellium/cellium/cells/crdregister"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/ipcache"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/cells/leaderelection"
	"github.com/cellium/cellium/statedb/endpoints"
	ipcachetables "github.com/cellium/cellium/statedb/ipcache"
	"github.com/cellium/cellium/statedb/nodes"
	"github.com/cellium/cellium/statedb/policy"
)

// TestCiliumEndpointSlicesSameIPCache runs the operator's slice batcher
// and two agents' ipcache derivation against the real API server, with
// the operator's and the agent's credentials from install/: one agent
// watches the CiliumEndpoints, the other (--enable-cilium-endpoint-slice)
// the slices. For the same CiliumEndpoints, created, relabelled and
// deleted, both ipcache tables hold the same rows. It runs once with the
// identities as CiliumIdentity objects and once as etcd keys, which the
// agents then read through the kvstore (identity=crd, identity=kvstore).
func TestCiliumEndpointSlicesSameIPCache(t *testing.T) {
	for _, mode := range identityModes {
		t.Run("identity="+mode, func(t *testing.T) { testSlicesSameIPCache(t, mode) })
	}
}

func testSlicesSameIPCache(t *testing.T, identityMode string) {
	c := cluster.Get(t)
	ns := c.TestNamespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	opKube, err := c.OperatorKubeconfig(ctx)
	if err != nil {
		t.Fatal(err)
	}
	agentKube, err := c.AgentKubeconfig(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cfg := c.RESTConfig()
	cfg.QPS, cfg.Burst = 500, 500
	admin, err := versioned.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	backend := newIdentityBackend(t, identityMode)
	ignore := goleak.IgnoreCurrent()
	var opCS k8s.Clientset

	// The operator: CRDs and the batcher, leading at once; 40 endpoints a
	// slice, so that an identity needs several.
	op := hivetest.New(t, []string{"--k8s-kubeconfig-path=" + opKube, "--leader-election=false",
		"--enable-cilium-endpoint-slice=true", "--ces-max-ciliumendpoints-per-ces=40", `--ces-rate-limits=[{"nodes":0,"limit":50,"burst":100}]`},
		k8s.ClientCell, crdregister.Cell, leaderelection.Cell, k8s.CiliumEndpointsCell, k8s.CiliumNodesCell, cesbatcher.Cell,
		hive.Provide(func() k8s.UserAgent { return "cellium-operator-ces-test" }), hivetest.Capture(&opCS))
	var (
		hives   []*hive.Hive
		clients []k8s.Clientset
	)
	stopAll := func() {
		for _, h := range slices.Backward(hives) {
			if err := h.Stop(context.Background()); err != nil {
				t.Error(err)
			}
		}
		hives = nil
	}
	defer stopAll()
	if err := op.Start(ctx); err != nil {
		t.Fatal(err)
	}
	hives = append(hives, op)
	clients = append(clients, opCS)

	// Three identities of the namespace, one of another.
	const base = 61000
	for i, ns2 := range []string{ns, ns, ns, "elsewhere"} {
		backend.create(t, admin, base+i, map[string]string{"k8s:io.kubernetes.pod.namespace": ns2, "k8s:app": fmt.Sprintf("app%d", i)})
	}

	// Two agents on node-local, one per mode.
	type agent struct {
		db  *statedb.DB
		ipc statedb.Table[*ipcachetables.Entry]
	}
	newAgent := func(slices bool) agent {
		var (
			a     agent
			cs    k8s.Clientset
			local statedb.RWTable[*nodes.LocalNode]
			nds   statedb.RWTable[*nodes.Node]
		)
		h := hivetest.New(t, append([]string{"--k8s-kubeconfig-path=" + agentKube, "--enable-cilium-endpoint-slice=" + strconv.FormatBool(slices)}, backend.args...),
			append(backend.cells(), k8s.ClientCell, k8s.AgentCiliumEndpointsCell, k8s.CiliumIdentitiesCell, ipcache.Cell,
				hive.Provide(func() k8s.UserAgent { return "cellium-agent-ces-test" },
					func() k8s.NodeName { return "node-local" },
					endpoints.NewTable, statedb.RWTable[*endpoints.Endpoint].ToTable,
					nodes.NewLocalNodeTable, statedb.RWTable[*nodes.LocalNode].ToTable,
					nodes.NewNodesTable, statedb.RWTable[*nodes.Node].ToTable,
					policy.NewCIDRTable, statedb.RWTable[*policy.CIDRIdentity].ToTable),
				hivetest.Capture(&a.db), hivetest.Capture(&a.ipc), hivetest.Capture(&local), hivetest.Capture(&nds), hivetest.Capture(&cs))...)
		if err := h.Start(ctx); err != nil {
			t.Fatal(err)
		}
		hives = append(hives, h)
		clients = append(clients, cs)
		txn := a.db.WriteTxn(local, nds)
		_, _, _ = local.Insert(txn, &nodes.LocalNode{Name: "node-local", InternalIP: netip.MustParseAddr("192.0.2.10"),
			RouterIP: netip.MustParseAddr("10.10.0.1"), PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.10.0.0/24")}})
		for i := 1; i <= 2; i++ {
			_, _, _ = nds.Insert(txn, &nodes.Node{Name: fmt.Sprintf("remote-%d", i), Source: "test",
				Addresses: []nodes.Address{{Type: nodes.AddressInternalIP, IP: netip.MustParseAddr(fmt.Sprintf("192.0.2.%d", 10+i))}},
				PodCIDRs:  []netip.Prefix{netip.MustParsePrefix(fmt.Sprintf("10.%d.0.0/16", 10+i))}})
		}
		txn.Commit()
		return a
	}
	cepMode, cesMode := newAgent(false), newAgent(true)

	// 150 endpoints on two remote nodes, three identities; a few refused
	// ones (the other namespace's identity, an address outside its node).
	cep := func(i, id int) *ciliumv2.CiliumEndpoint {
		node := 1 + i%2
		ip := fmt.Sprintf("10.%d.%d.%d", 10+node, i/200, i%200+1)
		if i%50 == 49 {
			ip = fmt.Sprintf("10.99.0.%d", i%200+1) // outside the node's pod CIDR
		}
		return &ciliumv2.CiliumEndpoint{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pod-%03d", i), Namespace: ns,
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: fmt.Sprintf("pod-%03d", i), UID: types.UID(fmt.Sprintf("uid-%d", i))}}},
			Status: ciliumv2.EndpointStatus{ID: int64(i + 1), Identity: &ciliumv2.EndpointIdentity{ID: int64(id)}, State: ciliumv2.EndpointStateReady,
				Networking: &ciliumv2.EndpointNetworking{NodeIP: fmt.Sprintf("192.0.2.%d", 10+node),
					Addressing: ciliumv2.AddressPairList{{IPV4: ip}}}},
		}
	}
	api := admin.CiliumV2().CiliumEndpoints(ns)
	for i := range 150 {
		if _, err := api.Create(ctx, cep(i, base+i%4), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// Refused: the other namespace's identity (i%4 == 3), an address
	// outside the node (i%50 == 49).
	accepted := 0
	for i := range 150 {
		if i%4 != 3 && i%50 != 49 {
			accepted++
		}
	}
	same(t, "after creating 150 CiliumEndpoints", cepMode.db, cepMode.ipc, cesMode.db, cesMode.ipc, accepted)
	checkSlices(t, admin, ns, 150, 40)

	// Steady state: one more endpoint changes one slice, and no other
	// slice was written since (the batcher does not rewrite slices that
	// are right).
	before := sliceVersions(t, admin, ns)
	if _, err := api.Create(ctx, cep(200, base), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	checkSlices(t, admin, ns, 151, 40)
	changed := 0
	for name, rv := range sliceVersions(t, admin, ns) {
		if before[name] != rv {
			changed++
		}
	}
	if changed != 1 {
		t.Errorf("%d slices written for one new endpoint, want 1", changed)
	}
	if err := api.Delete(ctx, "pod-200", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	// Relabel 20 (a move between slices), delete 30, add 10.
	for i := range 20 {
		cur, err := api.Get(ctx, fmt.Sprintf("pod-%03d", i), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cur.Status.Identity.ID = base + int64((i+1)%3)
		if _, err := api.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 100; i < 130; i++ {
		if err := api.Delete(ctx, fmt.Sprintf("pod-%03d", i), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 150; i < 160; i++ {
		if _, err := api.Create(ctx, cep(i, base+i%3), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	same(t, "after the churn", cepMode.db, cepMode.ipc, cesMode.db, cesMode.ipc, -1)
	checkSlices(t, admin, ns, 130, 40)

	// Every endpoint gone: no slice left, no CiliumEndpoint row left.
	if err := api.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	same(t, "after deleting everything", cepMode.db, cepMode.ipc, cesMode.db, cesMode.ipc, 0)
	checkSlices(t, admin, ns, 0, 40)

	stopAll()
	// As TestAgentHiveInProcess: idle connections close a moment after
	// their watches.
	for range 5 {
		for _, cs := range clients {
			k8s.CloseIdleConnections(cs)
		}
		if err = goleak.Find(ignore, goleak.IgnoreAnyFunction("k8s.io/klog/v2.(*loggingT).flushDaemon")); err == nil {
			return
		}
	}
	t.Fatalf("goroutines left after stop: %v", err)
}

// cepRows is an ipcache table's rows as text, and how many came from
// CiliumEndpoints.
func cepRows(db *statedb.DB, ipc statedb.Table[*ipcachetables.Entry]) (map[string]string, int) {
	rows := map[string]string{}
	n := 0
	for e := range ipc.All(db.ReadTxn()) {
		rows[e.Prefix.String()] = fmt.Sprintf("id=%d source=%s host=%s cidr=%d frontend=%v", e.Identity, e.Source, e.HostIP, e.CIDRIdentity, e.ServiceFrontend)
		if e.Source == ipcachetables.SourceCiliumEndpoint {
			n++
		}
	}
	return rows, n
}

// same waits until both ipcache tables hold the same rows, with want rows
// from CiliumEndpoints (-1: any number), and stay so for a moment.
func same(t *testing.T, what string, db1 *statedb.DB, ipc1 statedb.Table[*ipcachetables.Entry], db2 *statedb.DB, ipc2 statedb.Table[*ipcachetables.Entry], want int) {
	t.Helper()
	eventually(t, time.Minute, "equal ipcache tables "+what, func() error {
		a, n := cepRows(db1, ipc1)
		b, _ := cepRows(db2, ipc2)
		if want >= 0 && n != want {
			return fmt.Errorf("CEP mode has %d rows from CiliumEndpoints, want %d", n, want)
		}
		if !maps.Equal(a, b) {
			var diff []string
			for p, r := range a {
				if b[p] != r {
					diff = append(diff, fmt.Sprintf("%s: CEP mode %q, CES mode %q", p, r, b[p]))
				}
			}
			for p, r := range b {
				if _, ok := a[p]; !ok {
					diff = append(diff, fmt.Sprintf("%s: CEP mode none, CES mode %q", p, r))
				}
			}
			slices.Sort(diff)
			if len(diff) > 5 {
				diff = append(diff[:5], fmt.Sprintf("... %d more", len(diff)-5))
			}
			return fmt.Errorf("the modes differ: %s", strings.Join(diff, "; "))
		}
		return nil
	})
}

// checkSlices checks the slices of ns: every CiliumEndpoint in exactly
// one, one identity a slice, at most max entries.
func checkSlices(t *testing.T, admin versioned.Interface, ns string, want, max int) {
	t.Helper()
	eventually(t, time.Minute, "the slices of "+ns, func() error {
		l, err := admin.CiliumV2alpha1().CiliumEndpointSlices().List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return err
		}
		ceps, err := admin.CiliumV2().CiliumEndpoints(ns).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return err
		}
		ids := map[string]int64{}
		for _, c := range ceps.Items {
			ids[c.Name] = c.Status.Identity.ID
		}
		seen := map[string]bool{}
		for _, ces := range l.Items {
			if ces.Namespace != ns {
				continue
			}
			if len(ces.Endpoints) == 0 || len(ces.Endpoints) > max {
				return fmt.Errorf("slice %s has %d entries", ces.Name, len(ces.Endpoints))
			}
			for _, e := range ces.Endpoints {
				if seen[e.Name] {
					return fmt.Errorf("%s in two slices", e.Name)
				}
				seen[e.Name] = true
				if id, ok := ids[e.Name]; !ok || id != e.IdentityID || e.IdentityID != ces.Endpoints[0].IdentityID {
					return fmt.Errorf("slice %s entry %s has identity %d (its CiliumEndpoint: %d, %v)", ces.Name, e.Name, e.IdentityID, id, ok)
				}
			}
		}
		if len(seen) != want || len(ids) != want {
			return fmt.Errorf("%d endpoints in slices, %d CiliumEndpoints, want %d", len(seen), len(ids), want)
		}
		return nil
	})
}

// sliceVersions maps the names of ns's slices to their resourceVersions.
func sliceVersions(t *testing.T, admin versioned.Interface, ns string) map[string]string {
	t.Helper()
	l, err := admin.CiliumV2alpha1().CiliumEndpointSlices().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, ces := range l.Items {
		if ces.Namespace == ns {
			out[ces.Name] = ces.ResourceVersion
		}
	}
	return out
}
