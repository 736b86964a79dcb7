// Package loader loads the datapath's eBPF programs for each local
// endpoint and attaches them to its host-side veth: cil_from_container at
// the tcx ingress hook (packets leaving the pod: its egress policy),
// cil_to_container at the tcx egress hook (packets going to the pod: its
// ingress policy), or as clsact direct-action filters where the kernel has
// no tcx. Each load rewrites the per-endpoint constants (ENDPOINT_ID,
// SECURITY_IDENTITY, ENDPOINT_IFINDEX, ENDPOINT_MAC, POLICY_AUDIT_MODE),
// gives the programs the endpoint's own pinned policy map instead of the
// cellium_policy template and the pinned global maps.
//
// The tcx links are pinned under <bpffs>/cellium/endpoints/<id>/, named
// after their programs, so that a restarted agent finds them and replaces
// the programs in place (link update: no moment without a program)
// instead of detaching and attaching again.
//
// Ops is what the generic reconciler (statedb/reconciler) calls for the
// bpf-programs table (statedb/bpfprog); Deriver fills that table from the
// endpoints table. The package is plain Go; daemon/bpfloader composes it
// into the agent.
package loader
