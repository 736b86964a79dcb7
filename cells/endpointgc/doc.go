// Package endpointgc is the operator's CiliumEndpoint garbage collector.
// While this replica leads, every --cilium-endpoint-gc-interval it deletes
// the CiliumEndpoints that no longer stand for a live pod: the pod is gone,
// has finished (Succeeded or Failed), or is a new pod with the same name
// (another UID). It is the safety net for pods deleted while their node's
// agent was down. A `cilium-health-<node>` CiliumEndpoint, which has no
// pod, is kept while the CiliumNode <node> exists.
//
// It decides from the operator's pods, CiliumEndpoints and CiliumNodes
// tables and never before they are initialized, skips CiliumEndpoints
// younger than one interval (their pod may not be in the table yet), and
// deletes with a UID precondition, so a CiliumEndpoint re-created in the
// meantime is never deleted.
package endpointgc
