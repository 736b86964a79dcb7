// Package observer keeps the agent's recent Hubble flows in a ring buffer
// and serves them over Hubble's own gRPC API (the observer.Observer and
// peer.Peer services of github.com/cilium/cilium's api/v1), on a unix
// socket beside the agent API and, behind --hubble-listen-address, on TCP
// with TLS. The upstream hubble CLI and hubble-relay are its clients.
//
// Flows reach the ring through a hubble.Sink (the "hubble-sinks" group);
// readers follow the ring without ever blocking its writer: a reader that
// falls behind by more than the ring holds skips ahead and is told how
// many events it lost (a LostEvent with source HUBBLE_RING_BUFFER).
package observer
