// Package healthcheck is the agent's prober of the node's health endpoint
// (Cilium's cilium-health connectivity check, for the local node): every
// interval, and as soon as the health endpoint's interface appears or
// changes, it asks the responder in the health namespace for GET
// http://<health IP>:4240/hello from the node, and records in the
// health-probes table (statedb/health) whether it answered, how fast, and
// why not. GET /v1/healthz and `cellium status` show the result as
// "Cluster health".
//
// A probe is sent only when the endpoint has a host interface and the
// node routes the health IP through it (the path a pod's traffic takes),
// and then from a socket bound to that interface: without the datapath
// (--enable-endpoint-health-checking=false) or without host routes
// (--enable-endpoint-routes=false) the probe is reported unreachable with
// that reason and no packet leaves the node another way.
//
// The node prober (NodeProber) does what cilium-health does for the other
// nodes: every --health-check-interval it probes each other node of the
// nodes table on three paths (ICMP echo to its InternalIP, ICMP echo and
// GET /hello to its health IP) and keeps the outcome per path in the
// node-health table (statedb/health.NodePath), which Cluster health,
// `cellium health status` and the cilium_node_health_* metrics read.
package healthcheck
