package nodediscovery

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
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
	sorted := slices.Clone(cns)
	slices.SortFunc(sorted, func(a, b *ciliumv2.CiliumNode) int {
		if (a.Name == local) != (b.Name == local) {
			if a.Name == local {
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
	out := make([]*nodes.Node, 0, len(sorted))
	for _, cn := range sorted {
		n := &nodes.Node{Name: cn.Name, BootID: cn.Spec.BootID, Source: nodes.SourceCustomResource}
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
