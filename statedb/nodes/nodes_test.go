package nodes

import (
	"net/netip"
	"reflect"
	"testing"

	"github.com/cellium/cellium/statedb/reconciler"
)

// TestSameContentComparesEveryField changes each field of a LocalNode in
// turn: SameContent must notice all but Status, so that a field added
// later without a comparison fails here.
func TestSameContentComparesEveryField(t *testing.T) {
	base := LocalNode{
		Name: "n", UID: "u", Labels: map[string]string{"a": "1"}, Annotations: map[string]string{"b": "2"},
		NodeAddresses: []Address{{Type: AddressInternalIP, IP: netip.MustParseAddr("192.168.0.1")}},
		InternalIP:    netip.MustParseAddr("192.168.0.1"), RouterIP: netip.MustParseAddr("10.0.0.1"),
		PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}, HealthIPv4: netip.MustParseAddr("10.0.0.9"),
		BootID: "b",
	}
	changed := map[string]func(*LocalNode){
		"Name":          func(n *LocalNode) { n.Name = "m" },
		"UID":           func(n *LocalNode) { n.UID = "v" },
		"Labels":        func(n *LocalNode) { n.Labels = map[string]string{"a": "2"} },
		"Annotations":   func(n *LocalNode) { n.Annotations = nil },
		"NodeAddresses": func(n *LocalNode) { n.NodeAddresses = nil },
		"InternalIP":    func(n *LocalNode) { n.InternalIP = netip.Addr{} },
		"RouterIP":      func(n *LocalNode) { n.RouterIP = netip.MustParseAddr("10.0.0.2") },
		"PodCIDRs":      func(n *LocalNode) { n.PodCIDRs = nil },
		"HealthIPv4":    func(n *LocalNode) { n.HealthIPv4 = netip.Addr{} },
		"BootID":        func(n *LocalNode) { n.BootID = "c" },
	}
	typ := reflect.TypeFor[LocalNode]()
	for i := range typ.NumField() {
		name := typ.Field(i).Name
		if name == "Status" {
			continue
		}
		change, ok := changed[name]
		if !ok {
			t.Errorf("field %s is not covered: add it to SameContent and to this test", name)
			continue
		}
		n := base
		change(&n)
		if base.SameContent(&n) {
			t.Errorf("SameContent ignores a change of %s", name)
		}
	}
	if !base.SameContent(base.WithStatus(reconciler.Done())) {
		t.Error("SameContent compares Status")
	}
	empty := LocalNode{Name: "n", Labels: map[string]string{}}
	if !empty.SameContent(&LocalNode{Name: "n"}) {
		t.Error("an empty map differs from nil")
	}
}

func TestAddressesAndRows(t *testing.T) {
	n := &LocalNode{Name: "n", NodeAddresses: []Address{{Type: AddressInternalIP, IP: netip.MustParseAddr("192.168.0.1")}}}
	if got := n.Addresses(); len(got) != 1 {
		t.Errorf("Addresses without router = %v", got)
	}
	n.RouterIP = netip.MustParseAddr("10.0.0.1")
	got := n.Addresses()
	if len(got) != 2 || got[1] != (Address{Type: AddressCiliumInternalIP, IP: n.RouterIP}) {
		t.Errorf("Addresses = %v", got)
	}
	if len(n.NodeAddresses) != 1 {
		t.Error("Addresses modified the row")
	}
	node := &Node{Name: "x", Addresses: []Address{
		{Type: AddressInternalIP, IP: netip.MustParseAddr("fd00::1")},
		{Type: AddressInternalIP, IP: netip.MustParseAddr("192.168.0.2")},
	}}
	if ip, ok := node.Address(AddressInternalIP); !ok || ip != netip.MustParseAddr("192.168.0.2") {
		t.Errorf("Address prefers IPv4: got %v", ip)
	}
	if _, ok := node.Address(AddressExternalIP); ok {
		t.Error("Address of a missing type")
	}
	if h, r := len(node.TableHeader()), len(node.TableRow()); h != r {
		t.Errorf("Node: %d header columns, %d row columns", h, r)
	}
	if h, r := len(n.TableHeader()), len(n.TableRow()); h != r {
		t.Errorf("LocalNode: %d header columns, %d row columns", h, r)
	}
}
