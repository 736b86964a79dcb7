// Package plugin is the cellium CNI plugin: the ADD, DEL, CHECK, STATUS and
// GC commands of the CNI specification (versions 0.3.1 to 1.1.0) on top of
// the agent's API client (api/v1/client) and the pod interface code in
// datapath/link. The cellium-cni binary is its Main.
//
// The plugin is a thin client: the agent owns addresses and endpoints; the
// plugin creates the veth pair in between, because only it runs while the
// runtime holds the pod's network namespace. Every ADD that fails leaves
// nothing behind: the steps done so far are undone in reverse order.
//
// Errors are CNI error results with the codes listed in errors.go and in
// Documentation/operations/cni.md.
package plugin
