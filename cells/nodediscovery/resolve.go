package nodediscovery

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	kvtables "github.com/cellium/cellium/statedb/kvstore"
	"github.com/cellium/cellium/statedb/nodes"
)

// resolveNodes parses every CiliumNode into its nodes row and settles the
// disputes between them: an address or pod CIDR two nodes claim is kept by
// one and refused to the other (Node.Refused), so that neither wins
// silently and no packet is tunnelled to a node that merely claims an
// address. The local node keeps what it claims (the agent knows its own
// node first-hand); between other nodes the one whose CiliumNode was
// created first keeps it (by creationTimestamp, then name), which every
// agent decides alike whatever order its watch delivered the objects in,
// and which a node created later to hijack an address cannot win.
func resolveNodes(cns []*ciliumv2.CiliumNode, local string) []*nodes.Node {
	return resolveAll(cns, nil, local)
}

// nodeInput is one node to resolve: its CiliumNode (for a node known only
// from the kvstore, one made of its key), where it came from, and whether
// only the kvstore knows it.
type nodeInput struct {
	cn     *ciliumv2.CiliumNode
	source string
	kvOnly bool
}

// resolveAll is resolveNodes over the CiliumNodes and the nodes' kvstore
// keys. A node's key wins over its CiliumNode (Cilium's precedence of the
// kvstore source over custom-resource): its addresses, pod CIDRs, health
// IP and boot ID replace the CiliumNode's, whose creation time still
// orders the disputes. Nodes only the kvstore knows come after every node
// with a CiliumNode in the disputes, by name.
func resolveAll(cns []*ciliumv2.CiliumNode, kvs []*kvtables.Node, local string) []*nodes.Node {
	byName := map[string]int{}
	in := make([]nodeInput, 0, len(cns)+len(kvs))
	for _, cn := range cns {
		byName[cn.Name] = len(in)
		in = append(in, nodeInput{cn: cn, source: nodes.SourceCustomResource})
	}
	for _, kn := range kvs {
		if kn.Name == local {
			continue
		}
		cn := &ciliumv2.CiliumNode{}
		i, ok := byName[kn.Name]
		if ok {
			cn.ObjectMeta = in[i].cn.ObjectMeta
		}
		cn.Name = kn.Name
		cn.Spec.BootID = kn.BootID
		for _, a := range kn.Addresses {
			cn.Spec.Addresses = append(cn.Spec.Addresses, ciliumv2.NodeAddress{Type: ciliumv2.AddressType(a.Type), IP: a.IP.String()})
		}
		for _, p := range kn.PodCIDRs {
			cn.Spec.IPAM.PodCIDRs = append(cn.Spec.IPAM.PodCIDRs, p.String())
		}
		if kn.HealthIPv4.IsValid() {
			cn.Spec.HealthAddressing.IPv4 = kn.HealthIPv4.String()
		}
		if ok {
			in[i] = nodeInput{cn: cn, source: nodes.SourceKVStore}
		} else {
			byName[kn.Name] = len(in)
			in = append(in, nodeInput{cn: cn, source: nodes.SourceKVStore, kvOnly: true})
		}
	}
	slices.SortFunc(in, func(ai, bi nodeInput) int {
		a, b := ai.cn, bi.cn
		if (a.Name == local) != (b.Name == local) {
			if a.Name == local {
				return -1
			}
			return 1
		}
		if ai.kvOnly != bi.kvOnly {
			if bi.kvOnly {
				return -1
			}
			return 1
		}
		if c := a.CreationTimestamp.Time.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return cmp.Compare(a.Name, b.Name)
	})
	addrHolder := map[netip.Addr]string{}
	type held struct {
		p    netip.Prefix
		node string
	}
	var cidrHolders []held
	out := make([]*nodes.Node, 0, len(in))
	for _, ni := range in {
		cn := ni.cn
		n := &nodes.Node{Name: cn.Name, BootID: cn.Spec.BootID, Source: ni.source}
		if cn.Name == local {
			n.Local, n.Source = true, nodes.SourceLocal
		}
		refuse := func(field, value string, why nodes.RefusalReason, holder string) {
			n.Refused = append(n.Refused, nodes.Refusal{Field: field, Value: value, Reason: why, Holder: holder})
		}
		// mine are this node's own addresses: one address listed under
		// two types (InternalIP and ExternalIP) is no dispute.
		mine := map[netip.Addr]bool{}
		claimAddr := func(field, s string) (netip.Addr, bool) {
			ip, err := netip.ParseAddr(s)
			if err != nil || !usableNodeIP(ip, n.Local) {
				refuse(field, s, nodes.RefusedMalformedAddress, "")
				return netip.Addr{}, false
			}
			ip = ip.Unmap()
			if h, ok := addrHolder[ip]; ok && !mine[ip] {
				refuse(field, s, nodes.RefusedDuplicateNodeIP, h)
				return netip.Addr{}, false
			}
			mine[ip] = true
			return ip, true
		}
		for i, a := range cn.Spec.Addresses {
			switch a.Type {
			case ciliumv2.NodeHostName, ciliumv2.NodeInternalDNS, ciliumv2.NodeExternalDNS:
				continue // names, not addresses
			}
			if ip, ok := claimAddr(fmt.Sprintf("spec.addresses[%d]", i), a.IP); ok {
				n.Addresses = append(n.Addresses, nodes.Address{Type: string(a.Type), IP: ip})
			}
		}
		if s := cn.Spec.HealthAddressing.IPv4; s != "" {
			if ip, ok := claimAddr("spec.health.ipv4", s); ok {
				n.HealthIPv4 = ip
			}
		}
		for ip := range mine {
			addrHolder[ip] = n.Name
		}
	cidrs:
		for i, s := range cn.Spec.IPAM.PodCIDRs {
			field := fmt.Sprintf("spec.ipam.podCIDRs[%d]", i)
			p, err := netip.ParsePrefix(s)
			if err != nil || p.Bits() == 0 {
				refuse(field, s, nodes.RefusedMalformedPodCIDR, "")
				continue
			}
			p = p.Masked()
			for _, h := range cidrHolders {
				if h.node != n.Name && h.p.Overlaps(p) {
					refuse(field, s, nodes.RefusedDuplicatePodCIDR, h.node)
					continue cidrs
				}
			}
			n.PodCIDRs = append(n.PodCIDRs, p)
		}
		for _, p := range n.PodCIDRs {
			cidrHolders = append(cidrHolders, held{p: p, node: n.Name})
		}
		out = append(out, n)
	}
	return out
}

// usableNodeIP reports whether a node may have ip as an address: not the
// unspecified address, multicast or link-local, which would make every
// node (or none) its owner, and not loopback unless it is the local
// node's: another node's loopback address is every node's own, but a node
// may run on a loopback address of its machine (the dev nodes of
// make up NODE=dev, the soak's node).
func usableNodeIP(ip netip.Addr, local bool) bool {
	ip = ip.Unmap()
	return ip.IsValid() && !ip.IsUnspecified() && (local || !ip.IsLoopback()) && !ip.IsMulticast() &&
		!ip.IsLinkLocalUnicast() && !ip.IsLinkLocalMulticast() && !ip.IsInterfaceLocalMulticast()
}
