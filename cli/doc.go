// Package cli is the `cellium` command line, the operator's and debugger's
// view of one node (cellium's cilium-dbg). It talks only to the local
// agent's API on its unix socket, through api/v1/client, and prints what
// the agent knows in cilium-dbg's shapes: health (status), endpoints,
// identities, nodes, configuration and statedb tables. Objects print as
// JSON, YAML or a JSONPath template with -o; `endpoint get ID -o json`
// prints the endpoint whose .status is the pod's CiliumEndpoint .status.
//
// Run is the whole program; cli/cellium/main.go only calls it.
package cli
