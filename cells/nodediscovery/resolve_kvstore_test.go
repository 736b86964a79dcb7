package nodediscovery

import (
	"net/netip"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	kvtables "github.com/cellium/cellium/statedb/kvstore"
	"github.com/cellium/cellium/statedb/nodes"
)

// A node's kvstore key wins over its CiliumNode; a node only the kvstore
// knows loses address disputes to every node with a CiliumNode; the
// local node's own key is not used.
func TestResolveKVStoreNodes(t *testing.T) {
	old := metav1.NewTime(time.Unix(1000, 0))
	cn := func(name, ip string) *ciliumv2.CiliumNode {
		return &ciliumv2.CiliumNode{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: old},
			Spec: ciliumv2.NodeSpec{Addresses: []ciliumv2.NodeAddress{{Type: ciliumv2.NodeInternalIP, IP: ip}}}}
	}
	kv := func(name, ip string) *kvtables.Node {
		return &kvtables.Node{Name: name, Cluster: "default",
			Addresses: []nodes.Address{{Type: nodes.AddressInternalIP, IP: netip.MustParseAddr(ip)}},
			PodCIDRs:  []netip.Prefix{netip.MustParsePrefix("10.9.0.0/24")}}
	}
	got := map[string]*nodes.Node{}
	for _, n := range resolveAll(
		[]*ciliumv2.CiliumNode{cn("local", "192.168.0.1"), cn("both", "192.168.0.2"), cn("cr-only", "192.168.0.3")},
		[]*kvtables.Node{kv("local", "192.168.0.50"), kv("both", "192.168.0.20"), kv("kv-only", "192.168.0.3"), kv("kv-new", "192.168.0.4")},
		"local") {
		got[n.Name] = n
	}
	ip := func(name string) netip.Addr {
		a, _ := got[name].Address(nodes.AddressInternalIP)
		return a
	}
	if got["local"].Source != nodes.SourceLocal || ip("local") != netip.MustParseAddr("192.168.0.1") {
		t.Errorf("local: %+v", got["local"])
	}
	if got["both"].Source != nodes.SourceKVStore || ip("both") != netip.MustParseAddr("192.168.0.20") || len(got["both"].PodCIDRs) != 1 {
		t.Errorf("both: %+v, want the key's", got["both"])
	}
	if got["cr-only"].Source != nodes.SourceCustomResource || ip("cr-only") != netip.MustParseAddr("192.168.0.3") {
		t.Errorf("cr-only: %+v", got["cr-only"])
	}
	// kv-only claims cr-only's address: refused (and its pod CIDR, which
	// "both" holds, too).
	if n := got["kv-only"]; n.Source != nodes.SourceKVStore || ip("kv-only").IsValid() || len(n.Refused) != 2 {
		t.Errorf("kv-only: %+v, want its address and pod CIDR refused", n)
	}
	if n := got["kv-new"]; n.Source != nodes.SourceKVStore || ip("kv-new") != netip.MustParseAddr("192.168.0.4") {
		t.Errorf("kv-new: %+v", n)
	}
}
