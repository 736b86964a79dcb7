package kvstore

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/cellium/cellium/statedb/identity"
	kvtables "github.com/cellium/cellium/statedb/kvstore"
	"github.com/cellium/cellium/statedb/nodes"
)

// NodeJSON is Cilium's pkg/node/types.Node as it appears in etcd: no JSON
// tags, so the keys are the Go field names.
type NodeJSON struct {
	Name                    string
	Cluster                 string
	IPAddresses             []NodeAddressJSON
	IPv4AllocCIDR           *CIDRJSON
	IPv4SecondaryAllocCIDRs []*CIDRJSON
	IPv6AllocCIDR           *CIDRJSON
	IPv6SecondaryAllocCIDRs []*CIDRJSON
	IPv4HealthIP            net.IP
	IPv6HealthIP            net.IP
	IPv4IngressIP           net.IP
	IPv6IngressIP           net.IP
	ClusterID               uint32
	Source                  string
	EncryptionKey           uint8
	Labels                  map[string]string
	Annotations             map[string]string
	WireguardPubKey         string
	BootID                  string
}

// NodeAddressJSON is Cilium's node Address.
type NodeAddressJSON struct {
	Type string
	IP   net.IP
}

// CIDRJSON is Cilium's cidr.CIDR (an embedded *net.IPNet) in JSON.
type CIDRJSON struct {
	IP   net.IP
	Mask net.IPMask
}

// prefix converts c; false if it is not a prefix.
func (c *CIDRJSON) prefix() (netip.Prefix, bool) {
	if c == nil {
		return netip.Prefix{}, false
	}
	a, ok := netip.AddrFromSlice(c.IP)
	ones, bits := c.Mask.Size()
	if !ok || bits == 0 || (bits != 32 && bits != 128) {
		return netip.Prefix{}, false
	}
	a = a.Unmap()
	if a.BitLen() != bits {
		return netip.Prefix{}, false
	}
	return netip.PrefixFrom(a, ones).Masked(), true
}

// ParseNode reads the node key key with value v. It returns an error for
// anything Cilium would not accept or that does not belong where it is:
// not JSON, no name or cluster, a key that is not
// NodeKey(cluster, name), an address that is not one.
func ParseNode(key string, v []byte, rev int64) (*kvtables.Node, error) {
	var n NodeJSON
	if err := json.Unmarshal(v, &n); err != nil {
		return nil, fmt.Errorf("not a node: %w", err)
	}
	if n.Name == "" || n.Cluster == "" {
		return nil, errors.New("node without name or cluster")
	}
	if want := NodeKey(n.Cluster, n.Name); key != want {
		return nil, fmt.Errorf("key does not match node %s/%s (expected %s)", n.Cluster, n.Name, want)
	}
	out := &kvtables.Node{Key: key, Name: n.Name, Cluster: n.Cluster, BootID: n.BootID, ModRevision: rev}
	for _, a := range n.IPAddresses {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok || a.Type == "" {
			return nil, fmt.Errorf("address %q of type %q is not an IP", a.IP, a.Type)
		}
		out.Addresses = append(out.Addresses, nodes.Address{Type: a.Type, IP: ip.Unmap()})
	}
	cidrs := append([]*CIDRJSON{n.IPv4AllocCIDR}, n.IPv4SecondaryAllocCIDRs...)
	cidrs = append(cidrs, n.IPv6AllocCIDR)
	cidrs = append(cidrs, n.IPv6SecondaryAllocCIDRs...)
	for _, c := range cidrs {
		if c == nil {
			continue
		}
		p, ok := c.prefix()
		if !ok {
			return nil, fmt.Errorf("pod CIDR %v/%v is not a prefix", c.IP, c.Mask)
		}
		out.PodCIDRs = append(out.PodCIDRs, p)
	}
	if n.IPv4HealthIP != nil {
		ip, ok := netip.AddrFromSlice(n.IPv4HealthIP)
		if !ok {
			return nil, fmt.Errorf("health IP %q is not an IP", n.IPv4HealthIP)
		}
		out.HealthIPv4 = ip.Unmap()
	}
	return out, nil
}

// IPIdentitiesPrefix is the root of the ipcache keys (Cilium's
// ipcache.IPIdentitiesPath), and IPAddressSpace the one address space
// Cilium writes under it (ipcache.DefaultAddressSpace).
const (
	IPIdentitiesPrefix = StatePrefix + "/ip/v1"
	IPAddressSpace     = "default"
	// IPKeysPrefix + <IP> is an ipcache key; its value is IPIdentityPair
	// JSON; leased.
	IPKeysPrefix = IPIdentitiesPrefix + "/" + IPAddressSpace + "/"
)

// IPKey is the ipcache key of the address ip.
func IPKey(ip netip.Addr) string { return IPKeysPrefix + ip.String() }

// IPIdentityPair is Cilium's identity.IPIdentityPair, the value of an
// ipcache key, with its JSON names.
type IPIdentityPair struct {
	IP                net.IP                   `json:"IP"`
	Mask              net.IPMask               `json:"Mask"`
	HostIP            net.IP                   `json:"HostIP"`
	ID                identity.NumericIdentity `json:"ID"`
	Key               uint8                    `json:"Key"`
	Metadata          string                   `json:"Metadata"`
	K8sNamespace      string                   `json:"K8sNamespace,omitempty"`
	K8sPodName        string                   `json:"K8sPodName,omitempty"`
	K8sServiceAccount string                   `json:"K8sServiceAccount,omitempty"`
	NamedPorts        []NamedPortJSON          `json:"NamedPorts,omitempty"`
}

// NamedPortJSON is Cilium's identity.NamedPort.
type NamedPortJSON struct {
	Name     string `json:"Name"`
	Port     uint16 `json:"Port"`
	Protocol string `json:"Protocol"`
}

// EndpointMetadata is the Metadata Cilium writes for an endpoint:
// "cilium-global:default:<node>:<endpoint ID>".
func EndpointMetadata(node string, id uint16) string {
	return strings.Join([]string{"cilium-global", IPAddressSpace, node, strconv.Itoa(int(id))}, ":")
}

// ParseIPEntry reads the ipcache key key with value v. It returns an
// error for garbage: not JSON, no or a wrong IP, a key whose address is
// not the value's (Cilium's check), identity 0. Identity host (1) is read
// as remote-node (6), as Cilium does: the host of another node.
func ParseIPEntry(key string, v []byte, rev int64) (*kvtables.IPEntry, error) {
	name, ok := strings.CutPrefix(key, IPKeysPrefix)
	if !ok {
		return nil, fmt.Errorf("key outside %s", IPKeysPrefix)
	}
	var p IPIdentityPair
	if err := json.Unmarshal(v, &p); err != nil {
		return nil, fmt.Errorf("not an IPIdentityPair: %w", err)
	}
	ip, ok := netip.AddrFromSlice(p.IP)
	if !ok {
		return nil, fmt.Errorf("IP %q is not an address", p.IP)
	}
	ip = ip.Unmap()
	pfx := netip.PrefixFrom(ip, ip.BitLen())
	keyName := ip.String()
	if p.Mask != nil {
		ones, bits := p.Mask.Size()
		if bits != ip.BitLen() {
			return nil, fmt.Errorf("mask %v does not fit %s", p.Mask, ip)
		}
		pfx = netip.PrefixFrom(ip, ones)
		if ones != bits {
			keyName = pfx.String()
		}
	}
	if name != keyName {
		return nil, fmt.Errorf("address of the key %q differs from the value's %q", name, keyName)
	}
	if pfx.Masked() != pfx {
		return nil, fmt.Errorf("prefix %s has host bits", pfx)
	}
	if p.ID == identity.InvalidIdentity {
		return nil, errors.New("identity 0")
	}
	id := p.ID
	if id == identity.ReservedIdentityHost {
		id = identity.ReservedIdentityRemoteNode
	}
	e := &kvtables.IPEntry{Prefix: pfx, Identity: id, EncryptKey: p.Key, Metadata: p.Metadata,
		Namespace: p.K8sNamespace, PodName: p.K8sPodName, ModRevision: rev}
	if p.HostIP != nil {
		h, ok := netip.AddrFromSlice(p.HostIP)
		if !ok {
			return nil, fmt.Errorf("host IP %q is not an address", p.HostIP)
		}
		e.HostIP = h.Unmap()
	}
	return e, nil
}
