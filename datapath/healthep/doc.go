// Package healthep gives the node's health endpoint its datapath, as
// Cilium's cilium-health does: a network namespace (Cilium's name
// cilium-health, under /var/run/netns), a veth from the node (lxc_health)
// into it (cilium), the health IP inside as a /32 with a default route via
// the router IP (the addressing of a pod, made by datapath/link), and a
// responder: an HTTP server answering GET /hello with 200 on port 4240,
// whose listening socket is created inside the namespace while the
// server itself runs in the agent.
//
// The desired state is one row of the health-netns table (statedb/health),
// derived by the Deriver from the health endpoint row and the local node's
// router IP; Ops is the generic reconciler's target for it. Update is
// idempotent and adopts what is already there (a namespace and veth left
// by an earlier agent, even one killed with SIGKILL, are checked and kept
// rather than made anew), repairs what is missing or wrong (a namespace
// removed behind the agent's back, a deleted veth), and starts the
// responder when it is not serving in the namespace at the path. What it
// made is recorded in the health-interface table, which the endpoint
// manager copies into the health endpoint row.
//
// The package is plain Go; daemon/healthendpoint composes it into the
// agent behind --enable-endpoint-health-checking.
package healthep
