// Package v2alpha1 holds the Go types of the `cilium.io/v2alpha1` API group
// that cellium serves: CiliumEndpointSlice, which batches the CiliumEndpoints
// of one namespace into a few objects to lighten the API server's load.
//
// +kubebuilder:object:generate=true
// +groupName=cilium.io
package v2alpha1
