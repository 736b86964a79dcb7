// Package hostsockets lists the sockets of a network namespace (the
// agent's: the node's host namespace) that take traffic addressed to one
// of its ports: TCP sockets in LISTEN and UDP sockets bound to a port and
// not connected, IPv4 and IPv6, with the address they are bound to (a
// wildcard or one address), the socket's inode, and whether the calling
// process (the agent) holds it.
//
// It asks the kernel with sock_diag netlink dumps (vishvananda/netlink's
// SocketDiagTCP and SocketDiagUDP): one round trip per family and
// protocol, binary and typed, and bound to the namespace the handle's
// socket was created in, so that tests can list a namespace they created.
// /proc/net/{tcp,udp} would give the same rows as text of the reading
// thread's namespace. The dumps carry every socket (the library asks for
// all states); the sockets not listening are dropped here.
//
// Processes names the processes holding given sockets, from /proc/<pid>/fd.
package hostsockets
