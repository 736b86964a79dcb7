package datapathmonitor

import (
	"path/filepath"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/statedb"
	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/hubble"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/cells/metrics"
	cellmonitor "github.com/cellium/cellium/cells/monitor"
	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/ipcache"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/labels"
	"github.com/cellium/cellium/statedb/nodes"
	"github.com/cellium/cellium/statedb/policy"
	"github.com/cellium/cellium/test/privileged"
)

// flowSink hands the flows of the hubble cell to the test.
type flowSink chan *flowpb.Flow

func (s flowSink) OnFlow(f *flowpb.Flow) {
	select {
	case s <- f:
	default: // the test reads what it needs; never block the producer
	}
}

func (s flowSink) OnLost(*flowpb.LostEvent) {}

// TestPrivilegedDropBecomesHubbleFlow: the endpoint's real program, with
// an empty policy map, drops a UDP datagram to the pod; the drop goes from
// the kernel's ring buffer through this cell, the hub and the hubble cell
// to a Hubble flow: DROPPED, POLICY_DENIED, the pod's name and labels from
// the endpoints and identities tables, and the NetworkPolicy that makes
// its ingress deny by default named in ingress_denied_by.
func TestPrivilegedDropBecomesHubbleFlow(t *testing.T) {
	privileged.Require(t)

	root := t.TempDir()
	dir := filepath.Join(root, "cellium")
	if err := maps.EnsureBPFFS(dir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	m, err := maps.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	pm, err := maps.OpenPolicyMap(dir, testEndpoint)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pm.Close() })
	d := &datapath{t: t, policy: pm}
	d.node = newNetns(t)
	pod := newNetns(t)
	d.ifidx = vethPair(t, d.node, pod)
	coll := loadProgram(t, m, pm, d.ifidx, false)
	t.Cleanup(coll.Close)
	var l link.Link
	if err := d.node.Do(func(ns.NetNS) error {
		var err error
		l, err = link.AttachTCX(link.TCXOptions{Interface: d.ifidx,
			Program: coll.Programs["cil_to_container"], Attach: ebpf.AttachTCXEgress})
		return err
	}); err != nil {
		t.Fatalf("attach cil_to_container (tcx egress): %v", err)
	}
	t.Cleanup(func() { l.Close() })

	var (
		db   *statedb.DB
		eps  statedb.RWTable[*endpoints.Endpoint]
		ids  statedb.RWTable[*ciliumv2.CiliumIdentity]
		pols statedb.RWTable[*policy.EndpointPolicyRow]
	)
	sink := make(flowSink, 16)
	hivetest.Start(t, []string{"--bpf-root=" + root},
		fakeLoader, metrics.Cell, cellmonitor.Cell, Cell, hubble.Cell,
		// The tables flows are enriched from, filled by the test.
		hive.Provide(endpoints.NewTable, k8stables.NewPodsTable, ipcache.NewTable, nodes.NewNodesTable,
			k8stables.NewCiliumIdentitiesTable, policy.NewTable,
			statedb.RWTable[*endpoints.Endpoint].ToTable, statedb.RWTable[*corev1.Pod].ToTable,
			statedb.RWTable[*ipcache.Entry].ToTable, statedb.RWTable[*nodes.Node].ToTable,
			statedb.RWTable[*ciliumv2.CiliumIdentity].ToTable, statedb.RWTable[*policy.EndpointPolicyRow].ToTable,
			func() k8s.NodeName { return "node-1" },
			func() hubble.SinkOut { return hubble.SinkOut{Sink: sink} }),
		hivetest.Capture(&db), hivetest.Capture(&eps), hivetest.Capture(&ids), hivetest.Capture(&pols))

	w := db.WriteTxn(eps, ids, pols)
	_, _, _ = eps.Insert(w, &endpoints.Endpoint{ID: testEndpoint, PodNamespace: "demo", PodName: "web-1", IPv4: podAddr,
		Identity: testIdentity, Labels: labels.ParseLabels("k8s:app=web"), HostIfName: "cmon0", HostIfIndex: d.ifidx})
	_, _, _ = ids.Insert(w, &ciliumv2.CiliumIdentity{ObjectMeta: metav1.ObjectMeta{Name: "48213"},
		SecurityLabels: map[string]string{"k8s:app": "web", "k8s:io.kubernetes.pod.namespace": "demo"}})
	_, _, _ = pols.Insert(w, &policy.EndpointPolicyRow{EndpointID: testEndpoint, Identity: identity.NumericIdentity(testIdentity),
		Policy: &policy.EndpointPolicy{Revision: 3,
			Ingress: policy.DirectionPolicy{Enforcing: true, EnforcedBy: []string{"NetworkPolicy/demo/deny-all"}}}})
	w.Commit()

	sent := time.Now()
	d.sendUDP()
	// The program reports the datagram twice: the policy verdict (deny)
	// and the drop. Both become DROPPED flows naming the policy.
	seen := map[int32]bool{}
	timeout := time.After(30 * time.Second)
	for !seen[1] || !seen[5] {
		var f *flowpb.Flow
		select {
		case f = <-sink:
		case <-timeout:
			t.Fatalf("no drop and policy-verdict flows of the datagram within 30s (seen event types %v)", seen)
		}
		if f.GetL4().GetUDP().GetDestinationPort() != testPort {
			continue // ARP and the like
		}
		typ := f.GetEventType().GetType()
		if !seen[typ] {
			// A figure, not an assertion: ARP resolution included.
			t.Logf("the type %d flow reached the sink %v after the datagram was sent", typ, time.Since(sent))
		}
		seen[typ] = true
		if f.GetVerdict() != flowpb.Verdict_DROPPED || f.GetDropReasonDesc() != flowpb.DropReason_POLICY_DENIED ||
			f.GetTrafficDirection() != flowpb.TrafficDirection_INGRESS || f.GetNodeName() != "node-1" {
			t.Errorf("type %d flow: verdict %v reason %v direction %v node %q", typ,
				f.GetVerdict(), f.GetDropReasonDesc(), f.GetTrafficDirection(), f.GetNodeName())
		}
		if dst := f.GetDestination(); dst.GetPodName() != "web-1" || dst.GetNamespace() != "demo" || dst.GetID() != testEndpoint ||
			len(dst.GetLabels()) != 2 || dst.GetLabels()[0] != "k8s:app=web" {
			t.Errorf("type %d flow: destination %v, want demo/web-1 (endpoint %d) with its identity's labels", typ, dst, testEndpoint)
		}
		if src := f.GetSource(); src.GetIdentity() != 2 || len(src.GetLabels()) != 1 || src.GetLabels()[0] != "reserved:world" {
			t.Errorf("type %d flow: source %v, want world", typ, src)
		}
		if ip := f.GetIP(); ip.GetSource() != nodeAddr.String() || ip.GetDestination() != podAddr.String() {
			t.Errorf("type %d flow: addresses %v", typ, ip)
		}
		if by := f.GetIngressDeniedBy(); len(by) != 1 || by[0].GetKind() != "NetworkPolicy" || by[0].GetName() != "deny-all" {
			t.Errorf("type %d flow: ingress denied by %v, want NetworkPolicy demo/deny-all", typ, by)
		}
	}
}
