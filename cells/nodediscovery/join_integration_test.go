package nodediscovery_test

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"
	apiextclientset "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/client/clientset/versioned"
	"github.com/cellium/cellium/api/crds"
	"github.com/cellium/cellium/cells/agentapi"
	"github.com/cellium/cellium/cells/crdregister"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/ipam"
	"github.com/cellium/cellium/cells/ipcache"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/cells/nodediscovery"
	"github.com/cellium/cellium/cells/statedir"
	"github.com/cellium/cellium/statedb/endpoints"
	ipcachetable "github.com/cellium/cellium/statedb/ipcache"
	"github.com/cellium/cellium/statedb/nodes"
	"github.com/cellium/cellium/statedb/policy"
)

// TestIntegrationNodeJoinLeave runs node discovery and the ipcache against
// the real API server: CiliumNodes of other nodes created through the API
// become ipcache rows (their addresses remote-node, health IP health, pod
// CIDR world with the node as tunnel endpoint), and deleted, leave nothing
// behind. It logs how long a join takes from the create call to the rows
// (the figure, not an assertion). A CiliumNode created later that claims
// an older one's pod CIDR and InternalIP is refused those: the older keeps
// its rows. A node with a new boot ID (rebooted) has its rows written
// again; another change of its CiliumNode does not.
func TestIntegrationNodeJoinLeave(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test against kube-apiserver from test/harness; run without -short")
	}
	c := cluster.Get(t)
	ctx := t.Context()
	log := hivetest.Logger(t)
	apiext, err := apiextclientset.NewForConfig(c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	all, err := crds.All()
	if err != nil {
		t.Fatal(err)
	}
	if err := crdregister.Register(ctx, apiext.ApiextensionsV1().CustomResourceDefinitions(), all, log); err != nil {
		t.Fatal(err)
	}
	cilium, err := versioned.NewForConfig(c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	cns := cilium.CiliumV2().CiliumNodes()

	const nodeName = "it-node-join"
	t.Setenv("K8S_NODE_NAME", nodeName)
	knodes := c.Clientset().CoreV1().Nodes()
	node, err := knodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		_ = knodes.Delete(ctx, nodeName, metav1.DeleteOptions{})
		_ = cns.Delete(ctx, nodeName, metav1.DeleteOptions{})
	})
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.168.51.10"}}
	if _, err := knodes.UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	var (
		db    *statedb.DB
		ipc   statedb.Table[*ipcachetable.Entry]
		table statedb.Table[*nodes.Node]
	)
	h := hivetest.New(t, []string{
		"--k8s-kubeconfig-path=" + c.Kubeconfig(), "--state-dir=" + t.TempDir(),
		"--socket-path=" + filepath.Join(t.TempDir(), "cellium.sock"),
	},
		k8s.ClientCell, statedir.Cell, agentapi.Cell,
		hive.Provide(k8s.NodeNameFromEnv),
		k8s.AgentResourcesCell,
		ipam.Cell, nodediscovery.Cell,
		// The ipcache's other inputs, empty here.
		hive.Provide(endpoints.NewTable, statedb.RWTable[*endpoints.Endpoint].ToTable,
			policy.NewCIDRTable, statedb.RWTable[*policy.CIDRIdentity].ToTable),
		ipcache.Cell,
		hivetest.Capture(&db), hivetest.Capture(&ipc), hivetest.Capture(&table),
	)
	startCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := h.Start(startCtx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Stop(context.Background()) })

	// rowsOn returns the ipcache rows whose tunnel endpoint is ip.
	rowsOn := func(ip netip.Addr) map[string]string {
		out := map[string]string{}
		for e := range ipc.All(db.ReadTxn()) {
			if e.HostIP == ip {
				out[e.Prefix.String()] = string(e.Source)
			}
		}
		return out
	}
	waitRows := func(what string, ip netip.Addr, want map[string]string) time.Duration {
		t.Helper()
		start := time.Now()
		deadline := time.After(30 * time.Second)
		for {
			_, watch := ipc.AllWatch(db.ReadTxn())
			got := rowsOn(ip)
			if fmt.Sprint(got) == fmt.Sprint(want) {
				return time.Since(start)
			}
			select {
			case <-watch:
			case <-deadline:
				t.Fatalf("%s: rows on %s %v, want %v", what, ip, got, want)
			}
		}
	}
	cleanup := func(name string) {
		t.Cleanup(func() { _ = cns.Delete(context.Background(), name, metav1.DeleteOptions{}) })
	}

	// Measure from a running agent: its tables listed (the ipcache is
	// initialized once every input is).
	eventually(t, "the ipcache initialized", func() error {
		if ok, _ := ipc.Initialized(db.ReadTxn()); !ok {
			return fmt.Errorf("not yet")
		}
		return nil
	})
	// ...and its own CiliumNode seen back through the watch.
	eventually(t, "the local node in the nodes table", func() error {
		if _, _, ok := table.Get(db.ReadTxn(), nodes.NodeNameIndex.Query(nodeName)); !ok {
			return fmt.Errorf("not yet")
		}
		return nil
	})

	const joins = 10
	var took []time.Duration
	for i := range joins {
		name := fmt.Sprintf("it-join-%d", i)
		ip := netip.AddrFrom4([4]byte{192, 168, 52, byte(10 + i)})
		cidr := fmt.Sprintf("10.201.%d.0/24", i)
		health := fmt.Sprintf("10.201.%d.9", i)
		router := fmt.Sprintf("10.201.%d.1", i)
		cleanup(name)
		start := time.Now()
		if _, err := cns.Create(ctx, &ciliumv2.CiliumNode{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: ciliumv2.NodeSpec{
				BootID: "boot",
				Addresses: []ciliumv2.NodeAddress{{Type: ciliumv2.NodeInternalIP, IP: ip.String()},
					{Type: ciliumv2.NodeCiliumInternalIP, IP: router}},
				IPAM:             ciliumv2.IPAMSpec{PodCIDRs: []string{cidr}},
				HealthAddressing: ciliumv2.HealthAddressingSpec{IPv4: health},
			}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitRows("join "+name, ip, map[string]string{
			ip.String() + "/32": string(ipcachetable.SourceRemoteNode),
			router + "/32":      string(ipcachetable.SourceRemoteNode),
			health + "/32":      string(ipcachetable.SourceHealth),
			cidr:                string(ipcachetable.SourceNodeCIDR),
		})
		took = append(took, time.Since(start))
	}
	t.Logf("node join samples: %v", took)
	slices.Sort(took)
	t.Logf("node join, CiliumNode create call to its ipcache rows, %d joins: min %s, median %s, max %s",
		joins, took[0].Round(time.Microsecond), took[joins/2].Round(time.Microsecond), took[joins-1].Round(time.Microsecond))

	// A later CiliumNode claiming it-join-0's pod CIDR and InternalIP is
	// refused both; it-join-0 keeps its rows.
	cleanup("it-join-thief")
	if _, err := cns.Create(ctx, &ciliumv2.CiliumNode{ObjectMeta: metav1.ObjectMeta{Name: "it-join-thief"},
		Spec: ciliumv2.NodeSpec{
			Addresses: []ciliumv2.NodeAddress{{Type: ciliumv2.NodeInternalIP, IP: "192.168.52.10"},
				{Type: ciliumv2.NodeExternalIP, IP: "not-an-ip"}},
			IPAM: ciliumv2.IPAMSpec{PodCIDRs: []string{"10.201.0.0/24"}},
		}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the thief refused", func() error {
		n, _, ok := table.Get(db.ReadTxn(), nodes.NodeNameIndex.Query("it-join-thief"))
		if !ok || len(n.Refused) != 3 {
			return fmt.Errorf("row %+v", n)
		}
		return nil
	})
	n, _, _ := table.Get(db.ReadTxn(), nodes.NodeNameIndex.Query("it-join-thief"))
	var reasons []nodes.RefusalReason
	for _, r := range n.Refused {
		reasons = append(reasons, r.Reason)
	}
	if want := []nodes.RefusalReason{nodes.RefusedDuplicateNodeIP, nodes.RefusedMalformedAddress, nodes.RefusedDuplicatePodCIDR}; !slices.Equal(reasons, want) {
		t.Errorf("refused %v, want %v", reasons, want)
	}
	if e, _, ok := ipc.Get(db.ReadTxn(), ipcachetable.PrefixIndex.Query(netip.MustParsePrefix("10.201.0.0/24"))); !ok || e.Owner != "node it-join-0" {
		t.Errorf("10.201.0.0/24 = %+v, want it-join-0's", e)
	}

	// A node that rebooted (a new spec.bootID, as its agent writes it at
	// start) is treated as new: its nodes row and every ipcache row it
	// gives are written again, carrying the new boot ID (their map entries
	// and, in the datapath, its routes follow). Another change of its
	// CiliumNode does not rewrite them.
	rebooted := netip.MustParseAddr("192.168.52.11")
	revisions := func() map[string]statedb.Revision {
		out := map[string]statedb.Revision{}
		for e, rev := range ipc.All(db.ReadTxn()) {
			if e.HostIP == rebooted {
				out[e.Prefix.String()] = rev
			}
		}
		return out
	}
	before := revisions()
	if len(before) != 4 {
		t.Fatalf("it-join-1's rows %v, want 4", before)
	}
	update := func(change func(*ciliumv2.CiliumNode)) {
		t.Helper()
		cn, err := cns.Get(ctx, "it-join-1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		change(cn)
		if _, err := cns.Update(ctx, cn, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	update(func(cn *ciliumv2.CiliumNode) { cn.Labels = map[string]string{"touched": "yes"} })
	// A CiliumNode created after the label change: once its rows are
	// there, the label change has been through the tables too.
	cleanup("it-join-marker")
	if _, err := cns.Create(ctx, &ciliumv2.CiliumNode{ObjectMeta: metav1.ObjectMeta{Name: "it-join-marker"},
		Spec: ciliumv2.NodeSpec{Addresses: []ciliumv2.NodeAddress{{Type: ciliumv2.NodeInternalIP, IP: "192.168.53.1"}}}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRows("the marker node", netip.MustParseAddr("192.168.53.1"), map[string]string{"192.168.53.1/32": string(ipcachetable.SourceRemoteNode)})
	if got := revisions(); fmt.Sprint(got) != fmt.Sprint(before) {
		t.Errorf("a label change rewrote it-join-1's rows: revisions %v, before %v", got, before)
	}
	update(func(cn *ciliumv2.CiliumNode) { cn.Spec.BootID = "boot-2" })
	eventually(t, "it-join-1 treated as new after its reboot", func() error {
		n, _, ok := table.Get(db.ReadTxn(), nodes.NodeNameIndex.Query("it-join-1"))
		if !ok || n.BootID != "boot-2" {
			return fmt.Errorf("nodes row %+v", n)
		}
		for e, rev := range ipc.All(db.ReadTxn()) {
			if e.HostIP != rebooted {
				continue
			}
			if e.NodeBootID != "boot-2" || rev <= before[e.Prefix.String()] {
				return fmt.Errorf("row %s (revision %d, before %d): boot ID %q", e.Prefix, rev, before[e.Prefix.String()], e.NodeBootID)
			}
		}
		return nil
	})
	waitRows("it-join-1 after its reboot", rebooted, map[string]string{
		"192.168.52.11/32": string(ipcachetable.SourceRemoteNode),
		"10.201.1.1/32":    string(ipcachetable.SourceRemoteNode),
		"10.201.1.9/32":    string(ipcachetable.SourceHealth),
		"10.201.1.0/24":    string(ipcachetable.SourceNodeCIDR),
	})
	if err := cns.Delete(ctx, "it-join-marker", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	// Leaving: every row of each node goes with its CiliumNode.
	for i := 1; i < joins; i++ {
		name := fmt.Sprintf("it-join-%d", i)
		if err := cns.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitRows("leave "+name, netip.AddrFrom4([4]byte{192, 168, 52, byte(10 + i)}), map[string]string{})
	}
	// When the holder leaves, the thief's refusals are lifted: the
	// address and pod CIDR are its own now (nothing is remembered).
	if err := cns.Delete(ctx, "it-join-0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRows("it-join-0 left, the thief holds its address", netip.MustParseAddr("192.168.52.10"), map[string]string{
		"192.168.52.10/32": string(ipcachetable.SourceRemoteNode),
		"10.201.0.0/24":    string(ipcachetable.SourceNodeCIDR),
	})
	if e, _, ok := ipc.Get(db.ReadTxn(), ipcachetable.PrefixIndex.Query(netip.MustParsePrefix("10.201.0.0/24"))); !ok || e.Owner != "node it-join-thief" {
		t.Errorf("10.201.0.0/24 = %+v, want the thief's now", e)
	}
	if err := cns.Delete(ctx, "it-join-thief", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRows("the thief left", netip.MustParseAddr("192.168.52.10"), map[string]string{})
	for _, name := range []string{"it-join-0", "it-join-thief"} {
		if _, _, ok := table.Get(db.ReadTxn(), nodes.NodeNameIndex.Query(name)); ok {
			t.Errorf("%s is still in the nodes table", name)
		}
	}
}
