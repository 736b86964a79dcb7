// Package lbsync keeps the socket load balancer's tables (statedb/lb) and
// BPF maps (bpf/sock.c) in step with the cluster's Services:
//
//   - Deriver derives the lb-frontends and lb-backends tables from the
//     k8s-services and k8s-endpoint-slices tables (with kube-proxy
//     replacement also from local-node, for the NodePorts' addresses, and
//     with hostPorts from k8s-pods), incrementally: a change of a Service
//     or of one of its EndpointSlices recomputes that Service's frontends
//     only, a change of the node's addresses every Service's. Backends are shared between frontends and
//     counted; a backend gets a numeric ID when a frontend first uses it
//     and loses it when the last one stops;
//   - FrontendOps and BackendOps reconcile the two tables into
//     cellium_lb4_services and cellium_lb4_backends with the generic
//     reconciler (statedb/reconciler). A frontend is written only once
//     all its backends are in the backends map, slots first and the
//     count last, so a program never picks a slot that is not there yet;
//     a new version goes into the slot bank the frontend's slot 0 does not
//     name, slot 0 then switches to it (LB4_SVC_BANK1) and the old bank
//     is deleted: a reader sees the old backends or the new, never a mix;
//     a frontend with two scopes gets its internal scope written before
//     the external slot 0 announces it.
//     FrontendOps also keeps cellium_lb4_affinity_match, the (frontend,
//     backend ID) pairs the programs check before following a session
//     affinity entry, in step with the slots: a lost backend's pair
//     goes before any slot is rewritten.
//     WithMaglev, it also keeps each external frontend's Maglev table
//     (--bpf-lb-algorithm=maglev, datapath/maglev) in cellium_lb4_maglev:
//     computed from the frontend's backends and swapped in whole before
//     the slot 0 that announces the frontend, deleted after it.
//
// The package works on small interfaces (ServicesMap, BackendsMap,
// AffinityMatchMap) so that its logic is tested with in-memory maps;
// PinnedServices, PinnedBackends and PinnedAffinityMatch adapt
// datapath/maps. It is plain Go; daemon/socklb
// composes it into the agent.
package lbsync
