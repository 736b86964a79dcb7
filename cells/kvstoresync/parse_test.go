package kvstoresync

import (
	"encoding/json"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/cellium/cellium/cells/kvstore"
)

// Values as Cilium v1.20.2 writes them (IPIdentityPair, Node JSON) parse;
// garbage does not, each for its reason.
func TestParseIPEntry(t *testing.T) {
	const ciliumValue = `{"IP":"10.0.1.5","Mask":null,"HostIP":"192.168.1.2","ID":12345,"Key":0,` +
		`"Metadata":"cilium-global:default:node-1:1234","K8sNamespace":"default","K8sPodName":"web-0",` +
		`"NamedPorts":[{"Name":"http","Port":80,"Protocol":"TCP"}]}`
	e, err := ParseIPEntry("cilium/state/ip/v1/default/10.0.1.5", []byte(ciliumValue), 7)
	if err != nil {
		t.Fatal(err)
	}
	if e.Prefix != netip.MustParsePrefix("10.0.1.5/32") || e.Identity != 12345 || e.HostIP != netip.MustParseAddr("192.168.1.2") ||
		e.PodName != "web-0" || e.Namespace != "default" || e.ModRevision != 7 || e.Metadata != "cilium-global:default:node-1:1234" {
		t.Errorf("parsed %+v", e)
	}
	// A prefix key (Mask set) is named IP/len, as Cilium's PrefixString.
	if e, err := ParseIPEntry("cilium/state/ip/v1/default/10.3.0.0/16", []byte(`{"IP":"10.3.0.0","Mask":"//8AAA==","ID":16777217}`), 1); err != nil || e.Prefix.Bits() != 16 {
		t.Errorf("prefix key: %+v, %v", e, err)
	}
	// Host (1) from another node is remote-node (6), as in Cilium.
	if e, err := ParseIPEntry("cilium/state/ip/v1/default/192.168.1.2", []byte(`{"IP":"192.168.1.2","ID":1}`), 1); err != nil || e.Identity != 6 {
		t.Errorf("host identity: %+v, %v", e, err)
	}
	for name, kv := range map[string][2]string{
		"not json":         {"cilium/state/ip/v1/default/10.0.0.1", "garbage"},
		"no IP":            {"cilium/state/ip/v1/default/10.0.0.1", `{"ID":5}`},
		"wrong IP":         {"cilium/state/ip/v1/default/10.0.0.1", `{"IP":"10.0.0.2","ID":5}`},
		"key not an IP":    {"cilium/state/ip/v1/default/bogus", `{"IP":"bogus","ID":5}`},
		"identity 0":       {"cilium/state/ip/v1/default/10.0.0.1", `{"IP":"10.0.0.1","ID":0}`},
		"bad host IP":      {"cilium/state/ip/v1/default/10.0.0.1", `{"IP":"10.0.0.1","ID":5,"HostIP":"nope"}`},
		"ID not a number":  {"cilium/state/ip/v1/default/10.0.0.1", `{"IP":"10.0.0.1","ID":"5"}`},
		"mask of v6":       {"cilium/state/ip/v1/default/10.0.0.1", `{"IP":"10.0.0.1","ID":5,"Mask":"/////////////////////w=="}`},
		"host bits in pfx": {"cilium/state/ip/v1/default/10.3.0.1/16", `{"IP":"10.3.0.1","Mask":"//8AAA==","ID":5}`},
		"other space":      {"cilium/state/ip/v1/other/10.0.0.1", `{"IP":"10.0.0.1","ID":5}`},
	} {
		if e, err := ParseIPEntry(kv[0], []byte(kv[1]), 1); err == nil {
			t.Errorf("%s: parsed %+v", name, e)
		}
	}
}

// What the writer puts is what Cilium writes: its JSON names, Mask null
// for an address, and it parses back.
func TestIPIdentityPairJSON(t *testing.T) {
	v, err := json.Marshal(kvstore.IPIdentityPair{IP: net.ParseIP("10.0.1.5").To4(), HostIP: net.ParseIP("192.168.1.2").To4(), ID: 4242,
		Metadata: kvstore.EndpointMetadata("node-1", 12), K8sNamespace: "ns", K8sPodName: "p"})
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"IP":"10.0.1.5","Mask":null,"HostIP":"192.168.1.2","ID":4242,"Key":0,"Metadata":"cilium-global:default:node-1:12","K8sNamespace":"ns","K8sPodName":"p"}`
	if string(v) != want {
		t.Errorf("JSON\n got %s\nwant %s", v, want)
	}
	if _, err := ParseIPEntry(kvstore.IPKey(netip.MustParseAddr("10.0.1.5")), v, 1); err != nil {
		t.Error(err)
	}
}

func TestParseNode(t *testing.T) {
	const ciliumValue = `{"Name":"node-1","Cluster":"default","IPAddresses":[{"Type":"InternalIP","IP":"192.168.1.2"},` +
		`{"Type":"CiliumInternalIP","IP":"10.0.1.1"}],"IPv4AllocCIDR":{"IP":"10.0.1.0","Mask":"////AA=="},` +
		`"IPv6AllocCIDR":null,"IPv4HealthIP":"10.0.1.7","IPv6HealthIP":"","ClusterID":0,"Source":"local","BootID":"b1"}`
	n, err := ParseNode("cilium/state/nodes/v1/default/node-1", []byte(ciliumValue), 3)
	if err != nil {
		t.Fatal(err)
	}
	if n.Name != "node-1" || len(n.Addresses) != 2 || n.Addresses[1].IP != netip.MustParseAddr("10.0.1.1") ||
		len(n.PodCIDRs) != 1 || n.PodCIDRs[0] != netip.MustParsePrefix("10.0.1.0/24") || n.HealthIPv4 != netip.MustParseAddr("10.0.1.7") || n.BootID != "b1" {
		t.Errorf("parsed %+v", n)
	}
	for name, kv := range map[string][2]string{
		"not json":      {"cilium/state/nodes/v1/default/n", "{"},
		"no name":       {"cilium/state/nodes/v1/default/n", `{"Cluster":"default"}`},
		"no cluster":    {"cilium/state/nodes/v1/n", `{"Name":"n"}`},
		"key mismatch":  {"cilium/state/nodes/v1/default/n", `{"Name":"m","Cluster":"default"}`},
		"bad address":   {"cilium/state/nodes/v1/default/n", `{"Name":"n","Cluster":"default","IPAddresses":[{"Type":"InternalIP","IP":"x"}]}`},
		"bad pod CIDR":  {"cilium/state/nodes/v1/default/n", `{"Name":"n","Cluster":"default","IPv4AllocCIDR":{"IP":"10.0.0.0","Mask":"AA=="}}`},
		"bad health IP": {"cilium/state/nodes/v1/default/n", `{"Name":"n","Cluster":"default","IPv4HealthIP":"x"}`},
	} {
		if n, err := ParseNode(kv[0], []byte(kv[1]), 1); err == nil {
			t.Errorf("%s: parsed %+v", name, n)
		} else if strings.TrimSpace(err.Error()) == "" {
			t.Errorf("%s: empty error", name)
		}
	}
}
