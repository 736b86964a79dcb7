// Package k8s defines the statedb tables that mirror Kubernetes objects:
// one table per resource, keyed by "namespace/name" (or "name" for
// cluster-scoped objects), with a namespace index. The k8s cells fill them;
// everyone else reads them.
package k8s

import (
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/cilium.io/v2alpha1"
	"github.com/cellium/cellium/statedb/labels"
)

// Object is a Kubernetes object that can live in a table.
type Object interface {
	runtime.Object
	metav1.Object
}

// Table names, as shown by GET /v1/statedb/{table}.
const (
	PodsTable             = "k8s-pods"
	NamespacesTable       = "k8s-namespaces"
	NodesTable            = "k8s-nodes"
	NetworkPoliciesTable  = "k8s-network-policies"
	CNPsTable             = "k8s-cilium-network-policies"
	CCNPsTable            = "k8s-cilium-cw-network-policies"
	CiliumEndpointsTable  = "k8s-cilium-endpoints"
	CiliumNodesTable      = "k8s-cilium-nodes"
	CiliumIdentitiesTable = "k8s-cilium-identities"
	ServicesTable         = "k8s-services"
	EndpointSlicesTable   = "k8s-endpoint-slices"
	// CiliumEndpointSlicesTable is the operator's mirror of the
	// CiliumEndpointSlices it writes.
	CiliumEndpointSlicesTable = "k8s-cilium-endpoint-slices"
	// CiliumLoadBalancerIPPoolsTable is the operator's mirror of the
	// CiliumLoadBalancerIPPools (LB IPAM).
	CiliumLoadBalancerIPPoolsTable = "k8s-cilium-lb-ip-pools"
)

// Key is the primary key of an object: "namespace/name", or "name" for
// cluster-scoped objects (the same as client-go's MetaNamespaceKeyFunc).
func Key(obj metav1.Object) string {
	if ns := obj.GetNamespace(); ns != "" {
		return ns + "/" + obj.GetName()
	}
	return obj.GetName()
}

// NameIndex returns the primary index of a resource table; query it with
// Key-formatted strings.
func NameIndex[T Object]() statedb.Index[T, string] {
	return statedb.Index[T, string]{
		Name:       "name",
		FromObject: func(obj T) index.KeySet { return index.NewKeySet(index.String(Key(obj))) },
		FromKey:    index.String,
		FromString: index.FromString,
		Unique:     true,
	}
}

// NamespaceIndex returns the namespace index of a resource table.
func NamespaceIndex[T Object]() statedb.Index[T, string] {
	return statedb.Index[T, string]{
		Name:       "namespace",
		FromObject: func(obj T) index.KeySet { return index.NewKeySet(index.String(obj.GetNamespace())) },
		FromKey:    index.String,
		FromString: index.FromString,
	}
}

// NewTable creates and registers the table of one resource type.
func NewTable[T Object](db *statedb.DB, name string, extra ...statedb.Indexer[T]) (statedb.RWTable[T], error) {
	return newTable(db, name, append([]statedb.Indexer[T]{NamespaceIndex[T]()}, extra...)...)
}

// newTable creates and registers the table of one resource type with
// the name index and idx.
func newTable[T Object](db *statedb.DB, name string, idx ...statedb.Indexer[T]) (statedb.RWTable[T], error) {
	t, err := statedb.NewTableAny(db, name, header, row[T], NameIndex[T](), idx...)
	if err != nil {
		return nil, fmt.Errorf("create table %s: %w", name, err)
	}
	return t, nil
}

func header() []string { return []string{"Name", "ResourceVersion", "Age"} }

func row[T Object](obj T) []string {
	age := time.Since(obj.GetCreationTimestamp().Time).Truncate(time.Second)
	return []string{Key(obj), obj.GetResourceVersion(), age.String()}
}

// PodNodeIndex indexes pods by spec.nodeName.
var PodNodeIndex = statedb.Index[*corev1.Pod, string]{
	Name:       "node",
	FromObject: func(p *corev1.Pod) index.KeySet { return index.NewKeySet(index.String(p.Spec.NodeName)) },
	FromKey:    index.String,
	FromString: index.FromString,
}

// NewPodsTable creates the pods table (indexed also by node).
func NewPodsTable(db *statedb.DB) (statedb.RWTable[*corev1.Pod], error) {
	return NewTable(db, PodsTable, statedb.Indexer[*corev1.Pod](PodNodeIndex))
}

// NewNamespacesTable creates the namespaces table.
func NewNamespacesTable(db *statedb.DB) (statedb.RWTable[*corev1.Namespace], error) {
	return NewTable[*corev1.Namespace](db, NamespacesTable)
}

// NewNodesTable creates the nodes table.
func NewNodesTable(db *statedb.DB) (statedb.RWTable[*corev1.Node], error) {
	return NewTable[*corev1.Node](db, NodesTable)
}

// NewNetworkPoliciesTable creates the Kubernetes NetworkPolicy table.
func NewNetworkPoliciesTable(db *statedb.DB) (statedb.RWTable[*networkingv1.NetworkPolicy], error) {
	return NewTable[*networkingv1.NetworkPolicy](db, NetworkPoliciesTable)
}

// NewCNPsTable creates the CiliumNetworkPolicy table.
func NewCNPsTable(db *statedb.DB) (statedb.RWTable[*ciliumv2.CiliumNetworkPolicy], error) {
	return NewTable[*ciliumv2.CiliumNetworkPolicy](db, CNPsTable)
}

// NewCCNPsTable creates the CiliumClusterwideNetworkPolicy table.
func NewCCNPsTable(db *statedb.DB) (statedb.RWTable[*ciliumv2.CiliumClusterwideNetworkPolicy], error) {
	return NewTable[*ciliumv2.CiliumClusterwideNetworkPolicy](db, CCNPsTable)
}

// CiliumEndpointIdentityIndex indexes CiliumEndpoints by the identity
// their status names (status.identity.id); one without is not indexed.
// The ipcache checks a CEP against its CiliumIdentity and finds the CEPs to
// check again when an identity comes or goes with it.
var CiliumEndpointIdentityIndex = statedb.Index[*ciliumv2.CiliumEndpoint, int64]{
	Name: "identity",
	FromObject: func(c *ciliumv2.CiliumEndpoint) index.KeySet {
		if c.Status.Identity == nil {
			return index.KeySet{}
		}
		return index.NewKeySet(index.Int64(c.Status.Identity.ID))
	},
	FromKey:    index.Int64,
	FromString: index.Int64String,
}

// CiliumEndpointNodeIndex indexes CiliumEndpoints by the address of the
// node their status names (status.networking.node), parsed, IPv4-mapped
// IPv6 unmapped; one without a parsable address is not indexed.
var CiliumEndpointNodeIndex = statedb.Index[*ciliumv2.CiliumEndpoint, netip.Addr]{
	Name: "node-ip",
	FromObject: func(c *ciliumv2.CiliumEndpoint) index.KeySet {
		a, ok := CiliumEndpointNodeIP(c)
		if !ok {
			return index.KeySet{}
		}
		return index.NewKeySet(index.NetIPAddr(a))
	},
	FromKey:    index.NetIPAddr,
	FromString: index.NetIPAddrString,
}

// CiliumEndpointNodeIP returns the address of the node a CiliumEndpoint
// names (status.networking.node), unmapped; false when it has none that
// parses.
func CiliumEndpointNodeIP(c *ciliumv2.CiliumEndpoint) (netip.Addr, bool) {
	if c.Status.Networking == nil {
		return netip.Addr{}, false
	}
	a, err := netip.ParseAddr(c.Status.Networking.NodeIP)
	if err != nil {
		return netip.Addr{}, false
	}
	return a.Unmap(), true
}

// NewCiliumEndpointsTable creates the CiliumEndpoint table, indexed also
// by identity and by node address, and not by namespace: nobody looks
// CEPs up by namespace, and the agent holds one row per pod of the
// cluster (an index is a radix tree with a leaf per row).
func NewCiliumEndpointsTable(db *statedb.DB) (statedb.RWTable[*ciliumv2.CiliumEndpoint], error) {
	return newTable(db, CiliumEndpointsTable,
		statedb.Indexer[*ciliumv2.CiliumEndpoint](CiliumEndpointIdentityIndex),
		statedb.Indexer[*ciliumv2.CiliumEndpoint](CiliumEndpointNodeIndex))
}

// NewCiliumNodesTable creates the CiliumNode table.
func NewCiliumNodesTable(db *statedb.DB) (statedb.RWTable[*ciliumv2.CiliumNode], error) {
	return NewTable[*ciliumv2.CiliumNode](db, CiliumNodesTable)
}

// CiliumIdentityLabelsIndex indexes CiliumIdentities by their security
// labels: the key is labels.SortedList of the object's security-labels,
// so equal label sets have equal keys (CiliumIdentityLabelsKey). The
// identity allocator finds the cluster's identity for a label set with
// it; several objects may share one key (agents racing on new labels).
var CiliumIdentityLabelsIndex = statedb.Index[*ciliumv2.CiliumIdentity, string]{
	Name: "labels",
	FromObject: func(c *ciliumv2.CiliumIdentity) index.KeySet {
		return index.NewKeySet(index.String(CiliumIdentityLabelsKey(c)))
	},
	FromKey:    index.String,
	FromString: index.FromString,
}

// CiliumIdentityLabelsKey is the key of c in CiliumIdentityLabelsIndex.
func CiliumIdentityLabelsKey(c *ciliumv2.CiliumIdentity) string {
	return labels.FromMap(c.SecurityLabels, "").SortedList()
}

// NewCiliumIdentitiesTable creates the CiliumIdentity table, indexed also
// by security labels, and not by namespace (the objects have none: every
// row would be a leaf under the one empty key).
func NewCiliumIdentitiesTable(db *statedb.DB) (statedb.RWTable[*ciliumv2.CiliumIdentity], error) {
	return newTable(db, CiliumIdentitiesTable,
		statedb.Indexer[*ciliumv2.CiliumIdentity](CiliumIdentityLabelsIndex))
}

// NodeIP is the InternalIP of the named node in the nodes table, or "".
func NodeIP(txn statedb.ReadTxn, nodes statedb.Table[*corev1.Node], name string) string {
	n, _, ok := nodes.Get(txn, NameIndex[*corev1.Node]().Query(name))
	if !ok {
		return ""
	}
	return NodeInternalIP(n)
}

// NodeInternalIP returns a Node's first IPv4 InternalIP, else its first
// InternalIP, else "". It is the one rule for a node's IP: the local-node
// row's InternalIP (what CiliumEndpoints carry as status.networking.node)
// is computed with it.
func NodeInternalIP(n *corev1.Node) string {
	var v6 string
	for _, a := range n.Status.Addresses {
		if a.Type != corev1.NodeInternalIP {
			continue
		}
		if ip := net.ParseIP(a.Address); ip != nil && ip.To4() != nil {
			return a.Address
		}
		if v6 == "" {
			v6 = a.Address
		}
	}
	return v6
}

// NewServicesTable creates the Service table.
func NewServicesTable(db *statedb.DB) (statedb.RWTable[*corev1.Service], error) {
	return NewTable[*corev1.Service](db, ServicesTable)
}

// EndpointSliceServiceIndex indexes EndpointSlices by the Service they
// belong to ("namespace/name", from the kubernetes.io/service-name label);
// a slice without the label is not indexed.
var EndpointSliceServiceIndex = statedb.Index[*discoveryv1.EndpointSlice, string]{
	Name: "service",
	FromObject: func(s *discoveryv1.EndpointSlice) index.KeySet {
		name, ok := EndpointSliceService(s)
		if !ok {
			return index.KeySet{}
		}
		return index.NewKeySet(index.String(name))
	},
	FromKey:    index.String,
	FromString: index.FromString,
}

// EndpointSliceService returns the "namespace/name" of the Service slice
// belongs to, from its kubernetes.io/service-name label.
func EndpointSliceService(s *discoveryv1.EndpointSlice) (string, bool) {
	name := s.Labels[discoveryv1.LabelServiceName]
	if name == "" {
		return "", false
	}
	return s.Namespace + "/" + name, true
}

// NewEndpointSlicesTable creates the EndpointSlice table (indexed also by
// Service).
func NewEndpointSlicesTable(db *statedb.DB) (statedb.RWTable[*discoveryv1.EndpointSlice], error) {
	return NewTable(db, EndpointSlicesTable, statedb.Indexer[*discoveryv1.EndpointSlice](EndpointSliceServiceIndex))
}

// NewCiliumEndpointSlicesTable creates the CiliumEndpointSlice table.
// Slices are cluster-scoped: the namespace index holds them all under "".
func NewCiliumEndpointSlicesTable(db *statedb.DB) (statedb.RWTable[*v2alpha1.CiliumEndpointSlice], error) {
	return NewTable[*v2alpha1.CiliumEndpointSlice](db, CiliumEndpointSlicesTable)
}

// NewCiliumLoadBalancerIPPoolsTable creates the CiliumLoadBalancerIPPool
// table. Pools are cluster-scoped.
func NewCiliumLoadBalancerIPPoolsTable(db *statedb.DB) (statedb.RWTable[*ciliumv2.CiliumLoadBalancerIPPool], error) {
	return NewTable[*ciliumv2.CiliumLoadBalancerIPPool](db, CiliumLoadBalancerIPPoolsTable)
}
