// Package v2 holds the Go types of the `cilium.io/v2` API group that cellium
// serves: CiliumEndpoint, CiliumIdentity, CiliumNode, CiliumNetworkPolicy,
// CiliumClusterwideNetworkPolicy and CiliumLoadBalancerIPPool.
//
// The JSON encoding of every type matches Cilium's field for field, including
// which empty fields are still written (a CiliumEndpoint status always carries
// `encryption`, a policy direction always carries `enforcing`), so objects
// written by Cilium and by cellium can be read by either. The kubebuilder
// markers here are the source of the CRD manifests in api/crds.
//
// +kubebuilder:object:generate=true
// +groupName=cilium.io
package v2
