// Package doctor checks the node's endpoint invariants live and serves the
// result as GET /v1/doctor (`cellium doctor`). It compares the endpoints
// table with what must agree with it: IPAM's allocations, the host-side
// veths, the endpoint state files, this agent's identity references, the
// CiliumEndpoints of this node and the pods scheduled to it. Each
// disagreement is a finding with a kind, the object, what it means and
// what to do.
//
// The comparison (Check) is plain Go over a snapshot (Facts); the cell
// gathers the snapshot from statedb tables (the IPAM allocations among
// them) and one small interface, HostLinks for the veths, which the agent
// binary provides from the datapath (control-plane cells do not import
// datapath/).
package doctor
