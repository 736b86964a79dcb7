package nodediscovery

import (
	"encoding/json"
	"log/slog"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/statedb"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/nodes"
)

func testLocalNode(router, health string) *nodes.LocalNode {
	n := &nodes.LocalNode{
		Name:        "node1",
		UID:         "uid-1",
		Labels:      map[string]string{"kubernetes.io/hostname": "node1"},
		Annotations: map[string]string{"note": "x"},
		NodeAddresses: []nodes.Address{
			{Type: nodes.AddressInternalIP, IP: netip.MustParseAddr("192.168.1.10")},
			{Type: nodes.AddressExternalIP, IP: netip.MustParseAddr("1.2.3.4")},
		},
		InternalIP: netip.MustParseAddr("192.168.1.10"),
		BootID:     "boot-1",
	}
	if router != "" {
		n.RouterIP = netip.MustParseAddr(router)
	}
	if health != "" {
		n.HealthIPv4 = netip.MustParseAddr(health)
	}
	return n
}

func asJSON(v any) string {
	b, _ := json.MarshalIndent(v, "", "  ")
	return string(b)
}

func nodeRef(uid string) metav1.OwnerReference {
	return metav1.OwnerReference{APIVersion: "v1", Kind: "Node", Name: "node1", UID: types.UID(uid)}
}

func TestApplyLocalNode(t *testing.T) {
	otherRef := metav1.OwnerReference{APIVersion: "example.io/v1", Kind: "Thing", Name: "t", UID: "t-1"}
	for _, tc := range []struct {
		name    string
		cn      *ciliumv2.CiliumNode
		n       *nodes.LocalNode
		want    *ciliumv2.CiliumNode
		changed bool
	}{{
		name: "new object, no IPAM yet",
		cn:   &ciliumv2.CiliumNode{ObjectMeta: metav1.ObjectMeta{Name: "node1"}},
		n:    testLocalNode("", ""),
		want: &ciliumv2.CiliumNode{
			ObjectMeta: metav1.ObjectMeta{Name: "node1", Labels: map[string]string{"kubernetes.io/hostname": "node1"},
				Annotations: map[string]string{"note": "x"}, OwnerReferences: []metav1.OwnerReference{nodeRef("uid-1")}},
			Spec: ciliumv2.NodeSpec{BootID: "boot-1", Addresses: []ciliumv2.NodeAddress{
				{Type: ciliumv2.NodeInternalIP, IP: "192.168.1.10"}, {Type: ciliumv2.NodeExternalIP, IP: "1.2.3.4"}}},
		},
		changed: true,
	}, {
		name: "operator's and others' fields are kept",
		cn: &ciliumv2.CiliumNode{
			ObjectMeta: metav1.ObjectMeta{Name: "node1", Labels: map[string]string{"other": "keep", "kubernetes.io/hostname": "old"},
				OwnerReferences: []metav1.OwnerReference{otherRef}},
			Spec: ciliumv2.NodeSpec{
				InstanceID:       "i-123",
				Addresses:        []ciliumv2.NodeAddress{{Type: ciliumv2.NodeInternalIP, IP: "192.168.1.99"}},
				IPAM:             ciliumv2.IPAMSpec{PodCIDRs: []string{"10.0.3.0/24"}},
				Encryption:       ciliumv2.EncryptionSpec{Key: 3},
				HealthAddressing: ciliumv2.HealthAddressingSpec{IPv6: "fd00::9"},
			},
			Status: ciliumv2.NodeStatus{IPAM: ciliumv2.IPAMStatus{OperatorStatus: ciliumv2.IPAMOperatorStatus{Error: "e"}}},
		},
		n: testLocalNode("10.0.3.1", "10.0.3.7"),
		want: &ciliumv2.CiliumNode{
			ObjectMeta: metav1.ObjectMeta{Name: "node1", Labels: map[string]string{"other": "keep", "kubernetes.io/hostname": "node1"},
				Annotations: map[string]string{"note": "x"}, OwnerReferences: []metav1.OwnerReference{otherRef, nodeRef("uid-1")}},
			Spec: ciliumv2.NodeSpec{
				InstanceID: "i-123",
				BootID:     "boot-1",
				Addresses: []ciliumv2.NodeAddress{
					{Type: ciliumv2.NodeInternalIP, IP: "192.168.1.10"}, {Type: ciliumv2.NodeExternalIP, IP: "1.2.3.4"},
					{Type: ciliumv2.NodeCiliumInternalIP, IP: "10.0.3.1"}},
				IPAM:             ciliumv2.IPAMSpec{PodCIDRs: []string{"10.0.3.0/24"}},
				Encryption:       ciliumv2.EncryptionSpec{Key: 3},
				HealthAddressing: ciliumv2.HealthAddressingSpec{IPv4: "10.0.3.7", IPv6: "fd00::9"},
			},
			Status: ciliumv2.NodeStatus{IPAM: ciliumv2.IPAMStatus{OperatorStatus: ciliumv2.IPAMOperatorStatus{Error: "e"}}},
		},
		changed: true,
	}, {
		name: "a published CiliumInternalIP and health IP stay until ours are known",
		cn: &ciliumv2.CiliumNode{ObjectMeta: metav1.ObjectMeta{Name: "node1"}, Spec: ciliumv2.NodeSpec{
			Addresses:        []ciliumv2.NodeAddress{{Type: ciliumv2.NodeCiliumInternalIP, IP: "10.0.3.1"}},
			HealthAddressing: ciliumv2.HealthAddressingSpec{IPv4: "10.0.3.7"},
		}},
		n: testLocalNode("", ""),
		want: &ciliumv2.CiliumNode{
			ObjectMeta: metav1.ObjectMeta{Name: "node1", Labels: map[string]string{"kubernetes.io/hostname": "node1"},
				Annotations: map[string]string{"note": "x"}, OwnerReferences: []metav1.OwnerReference{nodeRef("uid-1")}},
			Spec: ciliumv2.NodeSpec{BootID: "boot-1", Addresses: []ciliumv2.NodeAddress{
				{Type: ciliumv2.NodeInternalIP, IP: "192.168.1.10"}, {Type: ciliumv2.NodeExternalIP, IP: "1.2.3.4"},
				{Type: ciliumv2.NodeCiliumInternalIP, IP: "10.0.3.1"}},
				HealthAddressing: ciliumv2.HealthAddressingSpec{IPv4: "10.0.3.7"}},
		},
		changed: true,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			cn := tc.cn.DeepCopy()
			if got := applyLocalNode(cn, tc.n); got != tc.changed {
				t.Errorf("changed = %v, want %v", got, tc.changed)
			}
			if !equality.Semantic.DeepEqual(tc.want, cn) {
				t.Errorf("CiliumNode =\n%s\nwant\n%s", asJSON(cn), asJSON(tc.want))
			}
			// Applying again changes nothing.
			if applyLocalNode(cn, tc.n) {
				t.Error("second apply changed the object")
			}
			if !upToDate(cn, tc.n) || upToDate(nil, tc.n) {
				t.Error("upToDate disagrees with applyLocalNode")
			}
		})
	}
}

func TestBuildLocalNode(t *testing.T) {
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "node1", UID: "uid-1", Labels: map[string]string{"a": "b"}},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeHostName, Address: "node1"},
			{Type: corev1.NodeInternalIP, Address: "fd00::10"},
			{Type: corev1.NodeExternalIP, Address: "1.2.3.4"},
			{Type: corev1.NodeInternalIP, Address: "192.168.1.10"},
			{Type: corev1.NodeInternalIP, Address: "not-an-ip"},
		}},
	}
	cn := &ciliumv2.CiliumNode{Spec: ciliumv2.NodeSpec{IPAM: ciliumv2.IPAMSpec{PodCIDRs: []string{"10.0.3.0/24", "bad"}}}}
	n := buildLocalNode(node, cn, netip.MustParseAddr("10.0.3.7"), netip.MustParseAddr("10.0.3.1"), "boot")
	want := &nodes.LocalNode{
		Name: "node1", UID: "uid-1", Labels: map[string]string{"a": "b"},
		NodeAddresses: []nodes.Address{
			{Type: nodes.AddressInternalIP, IP: netip.MustParseAddr("fd00::10")},
			{Type: nodes.AddressExternalIP, IP: netip.MustParseAddr("1.2.3.4")},
			{Type: nodes.AddressInternalIP, IP: netip.MustParseAddr("192.168.1.10")},
		},
		InternalIP: netip.MustParseAddr("192.168.1.10"),
		RouterIP:   netip.MustParseAddr("10.0.3.1"),
		HealthIPv4: netip.MustParseAddr("10.0.3.7"),
		PodCIDRs:   []netip.Prefix{netip.MustParsePrefix("10.0.3.0/24")},
		BootID:     "boot",
	}
	if !n.SameContent(want) {
		t.Errorf("buildLocalNode =\n%+v\nwant\n%+v", n, want)
	}
	node.Status.Addresses = nil
	if n := buildLocalNode(node, nil, netip.Addr{}, netip.Addr{}, ""); n.InternalIP.IsValid() {
		t.Errorf("InternalIP %v without addresses", n.InternalIP)
	}
}

func TestNodeFromCiliumNode(t *testing.T) {
	cn := &ciliumv2.CiliumNode{ObjectMeta: metav1.ObjectMeta{Name: "node2"}, Spec: ciliumv2.NodeSpec{
		BootID:           "b",
		Addresses:        []ciliumv2.NodeAddress{{Type: ciliumv2.NodeInternalIP, IP: "192.168.1.11"}, {Type: ciliumv2.NodeHostName, IP: "node2"}},
		IPAM:             ciliumv2.IPAMSpec{PodCIDRs: []string{"10.0.4.0/24"}},
		HealthAddressing: ciliumv2.HealthAddressingSpec{IPv4: "10.0.4.9"},
	}}
	want := &nodes.Node{Name: "node2", BootID: "b", Source: nodes.SourceCustomResource,
		Addresses:  []nodes.Address{{Type: nodes.AddressInternalIP, IP: netip.MustParseAddr("192.168.1.11")}},
		PodCIDRs:   []netip.Prefix{netip.MustParsePrefix("10.0.4.0/24")},
		HealthIPv4: netip.MustParseAddr("10.0.4.9")}
	if got := resolveNodes([]*ciliumv2.CiliumNode{cn}, "node1"); len(got) != 1 || !reflect.DeepEqual(got[0], want) {
		t.Errorf("resolveNodes =\n%s\nwant\n%s", asJSON(got), asJSON(want))
	}
	if n := resolveNodes([]*ciliumv2.CiliumNode{cn}, "node2")[0]; !n.Local || n.Source != nodes.SourceLocal {
		t.Errorf("local node = %+v", n)
	}
}

// cnAt is a CiliumNode created at second sec with InternalIP ip, pod
// CIDRs and health IP.
func cnAt(name string, sec int64, ip, health string, cidrs ...string) *ciliumv2.CiliumNode {
	return &ciliumv2.CiliumNode{
		ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.Unix(sec, 0)},
		Spec: ciliumv2.NodeSpec{
			Addresses:        []ciliumv2.NodeAddress{{Type: ciliumv2.NodeInternalIP, IP: ip}},
			IPAM:             ciliumv2.IPAMSpec{PodCIDRs: cidrs},
			HealthAddressing: ciliumv2.HealthAddressingSpec{IPv4: health},
		},
	}
}

// Two CiliumNodes claiming one address or overlapping pod CIDRs: the local
// node, else the older, keeps it; the other is refused that part (and
// keeps the rest); malformed parts are refused, names are skipped.
func TestResolveNodesRefusals(t *testing.T) {
	type ref = nodes.Refusal
	tests := []struct {
		name  string
		local string
		cns   []*ciliumv2.CiliumNode
		want  map[string][]ref
		cidrs map[string]string
	}{{
		name: "same pod CIDR: the older keeps it",
		cns: []*ciliumv2.CiliumNode{
			cnAt("b", 20, "192.168.1.12", "", "10.0.1.0/24"),
			cnAt("a", 10, "192.168.1.11", "", "10.0.1.0/24"),
		},
		want:  map[string][]ref{"b": {{Field: "spec.ipam.podCIDRs[0]", Value: "10.0.1.0/24", Reason: nodes.RefusedDuplicatePodCIDR, Holder: "a"}}},
		cidrs: map[string]string{"a": "10.0.1.0/24", "b": ""},
	}, {
		name: "overlapping pod CIDR, same age: the name decides",
		cns: []*ciliumv2.CiliumNode{
			cnAt("b", 10, "192.168.1.12", "", "10.0.0.0/16"),
			cnAt("a", 10, "192.168.1.11", "", "10.0.1.0/24", "10.1.0.0/24"),
		},
		want:  map[string][]ref{"b": {{Field: "spec.ipam.podCIDRs[0]", Value: "10.0.0.0/16", Reason: nodes.RefusedDuplicatePodCIDR, Holder: "a"}}},
		cidrs: map[string]string{"a": "10.0.1.0/24,10.1.0.0/24", "b": ""},
	}, {
		name:  "the local node keeps its pod CIDR even when younger",
		local: "b",
		cns: []*ciliumv2.CiliumNode{
			cnAt("b", 20, "192.168.1.12", "", "10.0.1.0/24"),
			cnAt("a", 10, "192.168.1.11", "", "10.0.1.0/24"),
		},
		want:  map[string][]ref{"a": {{Field: "spec.ipam.podCIDRs[0]", Value: "10.0.1.0/24", Reason: nodes.RefusedDuplicatePodCIDR, Holder: "b"}}},
		cidrs: map[string]string{"a": "", "b": "10.0.1.0/24"},
	}, {
		name: "same node IP: the older keeps it, the other keeps its pod CIDR",
		cns: []*ciliumv2.CiliumNode{
			cnAt("a", 10, "192.168.1.11", "10.0.1.9", "10.0.1.0/24"),
			cnAt("b", 20, "192.168.1.11", "10.0.1.9", "10.0.2.0/24"),
		},
		want: map[string][]ref{"b": {
			{Field: "spec.addresses[0]", Value: "192.168.1.11", Reason: nodes.RefusedDuplicateNodeIP, Holder: "a"},
			{Field: "spec.health.ipv4", Value: "10.0.1.9", Reason: nodes.RefusedDuplicateNodeIP, Holder: "a"},
		}},
		cidrs: map[string]string{"a": "10.0.1.0/24", "b": "10.0.2.0/24"},
	}, {
		name: "malformed",
		cns: []*ciliumv2.CiliumNode{
			cnAt("a", 10, "192.168.1.300", "not-an-ip", "10.0.1.0/33", "0.0.0.0/0", "10.0.2.7/24"),
			cnAt("b", 10, "0.0.0.0", "127.0.0.1", "10.0.3.0/24"),
		},
		want: map[string][]ref{
			"a": {
				{Field: "spec.addresses[0]", Value: "192.168.1.300", Reason: nodes.RefusedMalformedAddress},
				{Field: "spec.health.ipv4", Value: "not-an-ip", Reason: nodes.RefusedMalformedAddress},
				{Field: "spec.ipam.podCIDRs[0]", Value: "10.0.1.0/33", Reason: nodes.RefusedMalformedPodCIDR},
				{Field: "spec.ipam.podCIDRs[1]", Value: "0.0.0.0/0", Reason: nodes.RefusedMalformedPodCIDR},
			},
			"b": {
				{Field: "spec.addresses[0]", Value: "0.0.0.0", Reason: nodes.RefusedMalformedAddress},
				{Field: "spec.health.ipv4", Value: "127.0.0.1", Reason: nodes.RefusedMalformedAddress},
			},
		},
		cidrs: map[string]string{"a": "10.0.2.0/24", "b": "10.0.3.0/24"},
	}, {
		// The dev nodes and the soak's node run on a loopback address of
		// the machine: the local node may; another node may not.
		name:  "loopback: the local node's is its own",
		local: "a",
		cns: []*ciliumv2.CiliumNode{
			cnAt("a", 10, "127.46.65.22", "", "10.0.1.0/24"),
			cnAt("b", 10, "127.46.65.23", "", "10.0.2.0/24"),
		},
		want:  map[string][]ref{"b": {{Field: "spec.addresses[0]", Value: "127.46.65.23", Reason: nodes.RefusedMalformedAddress}}},
		cidrs: map[string]string{"a": "10.0.1.0/24", "b": "10.0.2.0/24"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := resolveNodes(tt.cns, tt.local)
			// Any order of the input gives the same rows.
			rev := slices.Clone(tt.cns)
			slices.Reverse(rev)
			again := resolveNodes(rev, tt.local)
			byName := func(ns []*nodes.Node) map[string]*nodes.Node {
				m := map[string]*nodes.Node{}
				for _, n := range ns {
					m[n.Name] = n
				}
				return m
			}
			if !reflect.DeepEqual(byName(got), byName(again)) {
				t.Errorf("the order of the CiliumNodes matters:\n%s\n%s", asJSON(got), asJSON(again))
			}
			for _, n := range got {
				if !reflect.DeepEqual(n.Refused, tt.want[n.Name]) {
					t.Errorf("node %s refused %s, want %s", n.Name, asJSON(n.Refused), asJSON(tt.want[n.Name]))
				}
				var cidrs []string
				for _, p := range n.PodCIDRs {
					cidrs = append(cidrs, p.String())
				}
				if s := strings.Join(cidrs, ","); s != tt.cidrs[n.Name] {
					t.Errorf("node %s pod CIDRs %q, want %q", n.Name, s, tt.cidrs[n.Name])
				}
			}
		})
	}
}

// syncNodes writes the refusals into the nodes table, noteRefusals counts
// them (gauge now, counter once each), and a refusal lifted when the holder
// goes leaves the gauge at zero and the counter as it was.
func TestSyncNodesCountsRefusals(t *testing.T) {
	db := statedb.New()
	cns, err := k8stables.NewCiliumNodesTable(db)
	if err != nil {
		t.Fatal(err)
	}
	tbl, err := nodes.NewNodesTable(db)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	stats := &refusalStats{refused: map[nodes.RefusalReason]int{}, total: map[nodes.RefusalReason]uint64{}}
	if err := registerRefusalMetrics(reg, stats); err != nil {
		t.Fatal(err)
	}
	last := map[string][]nodes.Refusal{}
	step := func(fn func(statedb.WriteTxn)) {
		t.Helper()
		w := db.WriteTxn(cns, tbl)
		fn(w)
		if err := syncNodes(w, cns, nil, tbl, "local"); err != nil {
			t.Fatal(err)
		}
		noteRefusals(w, tbl, last, stats, slog.New(slog.DiscardHandler))
		w.Commit()
	}
	value := func(name string, why nodes.RefusalReason) float64 {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				if mf.GetName() == name && m.GetLabel()[0].GetValue() == string(why) {
					return m.GetGauge().GetValue() + m.GetCounter().GetValue()
				}
			}
		}
		t.Fatalf("no %s{reason=%q}", name, why)
		return 0
	}
	step(func(w statedb.WriteTxn) {
		_, _, _ = cns.Insert(w, cnAt("a", 10, "192.168.1.11", "", "10.0.1.0/24"))
		_, _, _ = cns.Insert(w, cnAt("b", 20, "192.168.1.12", "", "10.0.1.0/24"))
	})
	// An unrelated change counts nothing again.
	step(func(w statedb.WriteTxn) { _, _, _ = cns.Insert(w, cnAt("c", 30, "192.168.1.13", "", "10.0.3.0/24")) })
	if g, c := value("cellium_nodes_refused", nodes.RefusedDuplicatePodCIDR), value("cellium_nodes_refused_total", nodes.RefusedDuplicatePodCIDR); g != 1 || c != 1 {
		t.Errorf("refused %v, total %v, want 1 and 1", g, c)
	}
	step(func(w statedb.WriteTxn) { _, _, _ = cns.Delete(w, cnAt("a", 10, "", "")) })
	b, _, _ := tbl.Get(db.ReadTxn(), nodes.NodeNameIndex.Query("b"))
	if len(b.Refused) != 0 || len(b.PodCIDRs) != 1 {
		t.Errorf("b after a left: %+v", b)
	}
	if _, _, ok := tbl.Get(db.ReadTxn(), nodes.NodeNameIndex.Query("a")); ok {
		t.Error("a's row stays after its CiliumNode's deletion")
	}
	if g, c := value("cellium_nodes_refused", nodes.RefusedDuplicatePodCIDR), value("cellium_nodes_refused_total", nodes.RefusedDuplicatePodCIDR); g != 0 || c != 1 {
		t.Errorf("refused %v, total %v, want 0 and 1", g, c)
	}
}
