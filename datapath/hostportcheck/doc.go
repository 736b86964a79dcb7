// Package hostportcheck reports the NodePorts and hostPorts the load
// balancer serves in eBPF while a socket of the node's host network
// namespace listens on the same port: the program on the node's uplinks
// (and the socket load balancer) take the port's traffic for the Service
// or pod, and the host process silently gets none of it from outside.
// The datapath is left as it is (Cilium's NodePort wins the same way);
// the collision is made visible.
//
// A Checker lists the host namespace's listening TCP and bound UDP
// sockets (datapath/hostsockets) when the NodePort and HostPort frontends
// of the lb-frontends table change (at most once per MinInterval) and
// every Interval, matches them with
// the NodePort and HostPort frontends (same protocol and port, the socket
// bound to a wildcard address or to the frontend's address; the agent's
// own sockets, such as its healthCheckNodePort server, left out), and
// keeps one Degraded row (reason HostPortInUse) per Service or pod in
// lb-service-states under the owner lb.HostSocketOwner(...), naming the
// port, the socket's address and, when /proc shows it, the process. The
// row goes when the socket does or the Service's port changes; the
// load balancer's deriver owns the table's other rows.
package hostportcheck
