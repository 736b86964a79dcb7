package nodediscovery

import (
	"encoding/json"
	"net/netip"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
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
	if got := nodeFromCiliumNode(cn, "node1"); !reflect.DeepEqual(got, want) {
		t.Errorf("nodeFromCiliumNode =\n%s\nwant\n%s", asJSON(got), asJSON(want))
	}
	if n := nodeFromCiliumNode(cn, "node2"); !n.Local || n.Source != nodes.SourceLocal {
		t.Errorf("local node = %+v", n)
	}
}
