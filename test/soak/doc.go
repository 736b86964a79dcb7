// Package soak is cellium's chaos soak: it drives one node of a real
// cluster (test/harness's API server, cellium-operator, cellium-agent and
// the devkubelet calling cellium-cni, all built from the tree) through pod
// churn, relabels, repeated and concurrent CNI DELs, repeated ADDs, agent
// and operator kills and API server outages, and checks at quiescent
// points that nothing was lost or freed twice: every live pod has one CEP
// and one endpoint with its UID and IP, IPAM holds exactly the endpoints'
// and the reserved addresses, identity references match their users, and
// no veth, netns, state file or IP is left behind ([Check]). With
// [Config.Datapath] the agent runs its eBPF datapath, host routing and
// socket load balancer, and the checks add the datapath's: the pinned
// maps hold what the agent's tables say and every live endpoint's
// entries, policy map and attached programs, nothing of deleted ones; a
// policy holds against TCP probes from inside the pods' namespaces; and a
// connection between two pinned pods survives every kill and outage.
//
// [Start] sets the node up, [Soak.Run] drives it and returns a [Report]
// (counts, violations, the [Timeline] of the last actions), [Soak.Close]
// removes everything. TestPrivilegedSoak runs it: two minutes inside
// `go test ./...`, longer with `make soak DURATION=30m`. See
// Documentation/contributing/testing.md.
package soak
