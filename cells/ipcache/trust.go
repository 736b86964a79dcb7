package ipcache

import (
	"math"
	"net/netip"
	"slices"

	"github.com/cilium/statedb"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/ipcache"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/labels"
	"github.com/cellium/cellium/statedb/nodes"
)

// Refusal is why the claims of a CiliumEndpoint of another node are kept
// out of the ipcache (see ipcache.Refusal, the refused-CEPs table's
// reason).
type Refusal = ipcache.Refusal

// The refusals, in the order they are checked (see ipcache.Refusal).
const (
	RefusedReservedIdentity   = ipcache.RefusedReservedIdentity
	RefusedUnknownIdentity    = ipcache.RefusedUnknownIdentity
	RefusedNamespaceMismatch  = ipcache.RefusedNamespaceMismatch
	RefusedUnknownNode        = ipcache.RefusedUnknownNode
	RefusedAddressOutsideNode = ipcache.RefusedAddressOutsideNode
)

// Refusals lists every Refusal, in the order they are checked.
var Refusals = []Refusal{RefusedReservedIdentity, RefusedUnknownIdentity, RefusedNamespaceMismatch,
	RefusedUnknownNode, RefusedAddressOutsideNode}

// namespaceLabel is the key of an identity's namespace in a
// CiliumIdentity's security-labels.
const namespaceLabel = labels.SourceK8s + ":" + labels.PodNamespaceLabel

// trust is what the checks of a CiliumEndpoint consult: the CiliumIdentity
// and nodes tables as of one transaction.
type trust struct {
	txn        statedb.ReadTxn
	identities statedb.Table[*ciliumv2.CiliumIdentity]
	nodes      statedb.Table[*nodes.Node]
}

// checkIdentity returns the CEP's identity if it is a CiliumIdentity of
// the CEP's namespace, else why not. The CEP has a status.identity.
func (tr trust) checkIdentity(cep *ciliumv2.CiliumEndpoint) (identity.NumericIdentity, Refusal) {
	raw := cep.Status.Identity.ID
	if raw < int64(identity.MinimalNumericIdentity) || raw > math.MaxUint32 {
		return 0, RefusedReservedIdentity
	}
	id := identity.NumericIdentity(raw)
	if id.Scope() != identity.IdentityScopeGlobal {
		return 0, RefusedReservedIdentity
	}
	obj, _, ok := tr.identities.Get(tr.txn, k8stables.NameIndex[*ciliumv2.CiliumIdentity]().Query(id.StringID()))
	if !ok {
		return 0, RefusedUnknownIdentity
	}
	if ns, ok := obj.SecurityLabels[namespaceLabel]; !ok || ns != cep.Namespace {
		return 0, RefusedNamespaceMismatch
	}
	return id, ""
}

// checkAddresses returns the CEP's addresses if the node it names (by
// nodeIP, valid or not) exists and its pod CIDRs hold every one of them,
// else why not. The CEP has a status.networking.
func (tr trust) checkAddresses(cep *ciliumv2.CiliumEndpoint, nodeIP netip.Addr) ([]netip.Addr, Refusal) {
	var (
		cidrs []netip.Prefix
		known bool
	)
	if nodeIP.IsValid() {
		for n := range tr.nodes.List(tr.txn, nodes.NodeInternalIPIndex.Query(nodeIP)) {
			known = true
			cidrs = append(cidrs, n.PodCIDRs...)
		}
	}
	if !known {
		return nil, RefusedUnknownNode
	}
	var addrs []netip.Addr
	for _, ap := range cep.Status.Networking.Addressing {
		if ap == nil {
			continue
		}
		for _, s := range []string{ap.IPV4, ap.IPV6} {
			if s == "" {
				continue
			}
			a, err := netip.ParseAddr(s)
			if err != nil || !inAny(cidrs, a.Unmap()) {
				return nil, RefusedAddressOutsideNode
			}
			addrs = append(addrs, a.Unmap())
		}
	}
	return addrs, ""
}

// isNodeHealthCEP reports whether cep is the health endpoint of the node
// it names: identity health (4) and no address but that node's health IP
// (spec.health of its CiliumNode). Its agent publishes it as it publishes
// every endpoint (kube-system/cilium-health-<node>); the node's CiliumNode
// already gives that address health, so the CEP adds nothing, and it is
// neither claimed nor refused (a reserved identity on any other address
// still is).
func (tr trust) isNodeHealthCEP(cep *ciliumv2.CiliumEndpoint, nodeIP netip.Addr) bool {
	if cep.Status.Identity.ID != int64(identity.ReservedIdentityHealth) || !nodeIP.IsValid() {
		return false
	}
	var health []netip.Addr
	for n := range tr.nodes.List(tr.txn, nodes.NodeInternalIPIndex.Query(nodeIP)) {
		if n.HealthIPv4.IsValid() {
			health = append(health, n.HealthIPv4)
		}
	}
	seen := false
	for _, ap := range cep.Status.Networking.Addressing {
		if ap == nil {
			continue
		}
		for _, s := range []string{ap.IPV4, ap.IPV6} {
			if s == "" {
				continue
			}
			a, err := netip.ParseAddr(s)
			if err != nil || !slices.Contains(health, a.Unmap()) {
				return false
			}
			seen = true
		}
	}
	return seen
}

func inAny(cidrs []netip.Prefix, a netip.Addr) bool {
	for _, p := range cidrs {
		if p.Contains(a) {
			return true
		}
	}
	return false
}
