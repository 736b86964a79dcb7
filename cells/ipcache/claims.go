package ipcache

import (
	"net/netip"
	"strconv"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/ipcache"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	kvtables "github.com/cellium/cellium/statedb/kvstore"
	"github.com/cellium/cellium/statedb/lb"
	"github.com/cellium/cellium/statedb/nodes"
	"github.com/cellium/cellium/statedb/policy"
)

// claim is one source's statement about a prefix.
type claim struct {
	id     identity.NumericIdentity
	source ipcache.Source
	hostIP netip.Addr
	// bootID is the boot ID of the other node that claims (nodeClaims).
	bootID string
}

// claims are an owner's statements, one per prefix. A slice, not a map:
// an owner claims one to a few prefixes, and the smallest map costs
// several times more than such a slice (with one map per remote
// endpoint, most of the deriver's memory).
type claims []prefixClaim

// prefixClaim is the claim of one prefix.
type prefixClaim struct {
	prefix netip.Prefix
	claim  claim
}

// get returns the claim of p.
func (c claims) get(p netip.Prefix) (claim, bool) {
	for i := range c {
		if c[i].prefix == p {
			return c[i].claim, true
		}
	}
	return claim{}, false
}

// equal reports whether c and o claim the same prefixes alike, in any
// order.
func (c claims) equal(o claims) bool {
	if len(c) != len(o) {
		return false
	}
	for _, pc := range c {
		if cl, ok := o.get(pc.prefix); !ok || cl != pc.claim {
			return false
		}
	}
	return true
}

// put claims p unless c holds a claim of p of the same or a higher
// precedence.
func (c *claims) put(p netip.Prefix, cl claim) {
	for i := range *c {
		if pc := &(*c)[i]; pc.prefix == p {
			if pc.claim.source.Precedence() < cl.source.Precedence() {
				pc.claim = cl
			}
			return
		}
	}
	*c = append(*c, prefixClaim{prefix: p, claim: cl})
}

func (c *claims) add(a netip.Addr, cl claim) {
	if !a.IsValid() {
		return
	}
	a = a.Unmap()
	c.put(netip.PrefixFrom(a, a.BitLen()), cl)
}

// Owners name the object a claim comes from; they are also the rows'
// Owner column.
func endpointOwner(id uint16) string   { return "endpoint " + strconv.Itoa(int(id)) }
func nodeOwner(name string) string     { return "node " + name }
func cepOwner(key string) string       { return "cep " + key }
func cidrOwner(p netip.Prefix) string  { return "cidr " + p.String() }
func frontendOwner(a lb.L4Addr) string { return "frontend " + a.String() }
func kvOwner(p netip.Prefix) string    { return "kvstore " + p.String() }

const localNodeOwner = "local-node"

// endpointClaims: a local endpoint's address has its identity once it has
// one; the health endpoint's is health (4) from the start.
func endpointClaims(e *endpoints.Endpoint) claims {
	var c claims
	switch {
	case e.Health:
		c.add(e.IPv4, claim{id: identity.ReservedIdentityHealth, source: ipcache.SourceHealth})
	case e.Identity != identity.InvalidIdentity:
		c.add(e.IPv4, claim{id: e.Identity, source: ipcache.SourceEndpoint})
	}
	return c
}

// localNodeClaims: the node's own addresses and router IP are host (1),
// its health address health (4).
func localNodeClaims(n *nodes.LocalNode) claims {
	var c claims
	if n == nil {
		return c
	}
	host := claim{id: identity.ReservedIdentityHost, source: ipcache.SourceHost}
	c.add(n.InternalIP, host)
	for _, a := range n.NodeAddresses {
		c.add(a.IP, host)
	}
	c.add(n.RouterIP, host)
	c.add(n.HealthIPv4, claim{id: identity.ReservedIdentityHealth, source: ipcache.SourceHealth})
	return c
}

// addPrefix adds the claim of a whole prefix.
func (c *claims) addPrefix(p netip.Prefix, cl claim) {
	if !p.IsValid() {
		return
	}
	c.put(p.Masked(), cl)
}

// nodeClaims: every address of a node (InternalIP, ExternalIP,
// CiliumInternalIP) is host (1) for the local node and remote-node (6) for
// the others; a node's health address is health (4). Another node's pod
// CIDRs are world (2) living on that node (its InternalIP the host IP, the
// tunnel endpoint), as Cilium's ipcache has them; a node without an
// InternalIP gives none, as nothing could be sent there.
func nodeClaims(n *nodes.Node) claims {
	var c claims
	hostIP, _ := n.Address(nodes.AddressInternalIP)
	// A new boot ID changes every claim of another node: its rows are
	// written again (the node rebooted and is treated as new).
	node := claim{id: identity.ReservedIdentityRemoteNode, source: ipcache.SourceRemoteNode, hostIP: hostIP, bootID: n.BootID}
	health := claim{id: identity.ReservedIdentityHealth, source: ipcache.SourceHealth, hostIP: hostIP, bootID: n.BootID}
	if n.Local {
		node = claim{id: identity.ReservedIdentityHost, source: ipcache.SourceHost}
		health.hostIP, health.bootID = netip.Addr{}, ""
	}
	for _, a := range n.Addresses {
		c.add(a.IP, node)
	}
	c.add(n.HealthIPv4, health)
	if !n.Local && hostIP.IsValid() {
		for _, p := range n.PodCIDRs {
			c.addPrefix(p, claim{id: identity.ReservedIdentityWorld, source: ipcache.SourceNodeCIDR, hostIP: hostIP, bootID: n.BootID})
		}
	}
	return c
}

// cepClaims: a CiliumEndpoint of another node gives its addresses its
// identity, living on its node, if it passes the checks of tr (see
// Refusal); else it claims nothing and the refusal says why. The CEPs of
// this node (node IP among local) give nothing: the endpoints table knows
// them first-hand. Nor does a CEP whose status has no identity or no
// networking yet (its agent is still writing it): no refusal.
func cepClaims(cep *ciliumv2.CiliumEndpoint, local map[netip.Addr]bool, tr trust) (claims, Refusal) {
	var c claims
	st := cep.Status
	if st.Identity == nil || st.Identity.ID == 0 || st.Networking == nil {
		return c, ""
	}
	nodeIP, _ := k8stables.CiliumEndpointNodeIP(cep)
	if nodeIP.IsValid() && local[nodeIP] {
		return c, ""
	}
	if tr.isNodeHealthCEP(cep, nodeIP) {
		return c, ""
	}
	id, why := tr.checkIdentity(cep)
	if why != "" {
		return c, why
	}
	addrs, why := tr.checkAddresses(cep, nodeIP)
	if why != "" {
		return c, why
	}
	cl := claim{id: id, source: ipcache.SourceCiliumEndpoint, hostIP: nodeIP}
	for _, a := range addrs {
		c.add(a, cl)
	}
	return c, ""
}

// kvClaims: an ipcache key of the kvstore gives its address its
// identity, living on its host IP; an entry whose host IP is this node's
// gives nothing (the endpoints table knows this node's pods first-hand,
// and a key a previous run left behind must not speak for them). The
// kvstore is written by agents only: no CiliumEndpoint-like checks.
func kvClaims(e *kvtables.IPEntry, local map[netip.Addr]bool) claims {
	if e.HostIP.IsValid() && local[e.HostIP] {
		return nil
	}
	return claims{{prefix: e.Prefix.Masked(), claim: claim{id: e.Identity, source: ipcache.SourceKVStore, hostIP: e.HostIP}}}
}

// cidrClaims: a prefix a policy rule names has its CIDR identity.
func cidrClaims(ci *policy.CIDRIdentity) claims {
	if !ci.Prefix.IsValid() {
		return nil
	}
	return claims{{prefix: ci.Prefix.Masked(), claim: claim{id: ci.Identity, source: ipcache.SourcePolicyCIDR}}}
}

// frontendClaims: the address of a Service frontend the socket load
// balancer translates is world (2), marked as a frontend (the winner's
// ServiceFrontend), unless a source of higher precedence holds it. Each
// port of a ClusterIP is an owner of its own, so the address stays
// marked while any of its frontends is left. Only ClusterIPs: the other
// frontends of kube-proxy replacement are node addresses (NodePort) or
// addresses outside the cluster (LoadBalancer, externalIPs) that keep
// the identity they have.
func frontendClaims(f *lb.Frontend) claims {
	var c claims
	if f.TypeName() != lb.TypeClusterIP {
		return c
	}
	c.add(f.Address.Addr, claim{id: identity.ReservedIdentityWorld, source: ipcache.SourceServiceFrontend})
	return c
}

// localAddrs is the set of this node's addresses, which mark the
// CiliumEndpoints of local pods.
func localAddrs(n *nodes.LocalNode, local *nodes.Node) map[netip.Addr]bool {
	m := map[netip.Addr]bool{}
	if n != nil {
		if n.InternalIP.IsValid() {
			m[n.InternalIP.Unmap()] = true
		}
		for _, a := range n.NodeAddresses {
			m[a.IP.Unmap()] = true
		}
	}
	if local != nil {
		for _, a := range local.Addresses {
			m[a.IP.Unmap()] = true
		}
	}
	return m
}
