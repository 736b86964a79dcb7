package kvstoresync

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/cellium/cellium/cells/kvstore"
	"github.com/cellium/cellium/statedb/identity"
	kvtables "github.com/cellium/cellium/statedb/kvstore"
	"github.com/cellium/cellium/statedb/nodes"
)

// cidrPrefix converts c; false if it is not a prefix.
func cidrPrefix(c *kvstore.CIDRJSON) (netip.Prefix, bool) {
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
	var n kvstore.NodeJSON
	if err := json.Unmarshal(v, &n); err != nil {
		return nil, fmt.Errorf("not a node: %w", err)
	}
	if n.Name == "" || n.Cluster == "" {
		return nil, errors.New("node without name or cluster")
	}
	if want := kvstore.NodeKey(n.Cluster, n.Name); key != want {
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
	cidrs := append([]*kvstore.CIDRJSON{n.IPv4AllocCIDR}, n.IPv4SecondaryAllocCIDRs...)
	cidrs = append(cidrs, n.IPv6AllocCIDR)
	cidrs = append(cidrs, n.IPv6SecondaryAllocCIDRs...)
	for _, c := range cidrs {
		if c == nil {
			continue
		}
		p, ok := cidrPrefix(c)
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

// ParseIPEntry reads the ipcache key key with value v. It returns an
// error for garbage: not JSON, no or a wrong IP, a key whose address is
// not the value's (Cilium's check), identity 0. Identity host (1) is read
// as remote-node (6), as Cilium does: the host of another node.
func ParseIPEntry(key string, v []byte, rev int64) (*kvtables.IPEntry, error) {
	name, ok := strings.CutPrefix(key, kvstore.IPKeysPrefix)
	if !ok {
		return nil, fmt.Errorf("key outside %s", kvstore.IPKeysPrefix)
	}
	var p kvstore.IPIdentityPair
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
