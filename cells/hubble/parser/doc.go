// Package parser turns one datapath event of the monitor hub
// (statedb/monitor.Event) into a Hubble flow (the flow.Flow protobuf of
// github.com/cilium/cilium's api/v1/flow), the way Cilium's Hubble fills
// one from its datapath's drop, trace and policy-verdict notifications:
// verdict, drop reason, event type, observation point, traffic direction,
// reply flag, addresses, ports, TCP flags, ICMP type and code.
//
// It enriches both ends from what the agent knows, read through the small
// interfaces of Sources so that tests can give fakes: the local endpoint
// or the remote pod holding an address (endpoint ID, identity, labels,
// namespace, pod name, workload), the node it lives on, the Service of a
// frontend address, and for policy verdicts and policy drops the rules
// that allowed or denied the flow (the endpoint's computed policy).
//
// The package starts no goroutine and keeps no state besides caches that
// are safe for concurrent use.
package parser
