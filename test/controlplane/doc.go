// Package controlplane runs the agent's control plane without privileges,
// from Kubernetes objects to the contents of in-memory BPF maps, driven by
// txtar scripts (testdata/*.txtar) on cilium/hive's script engine.
//
// A script's hive holds the agent's real control-plane cells (the k8s
// resource mirrors over a fake clientset, node discovery, IPAM, identity
// allocation, the endpoint manager and its API, the CEP sync, the policy
// engine, the ipcache) and the datapath's real derivers and map reconcilers (ipcache,
// lxc and policy maps; the socket load balancer's services and backends
// maps; the host-routing deriver) pointed at fake maps that keep their
// entries in memory. The script feeds objects in (k8s/add), makes
// endpoints the way the CNI plugin does (endpoint/add, over the agent's
// API socket), and compares statedb tables (db/cmp, statedb's own
// command) and map contents (maps/cmp) with expected files; go test
// -scripttest.update rewrites those files from what the run produced.
//
// Documentation/contributing/testing.md describes how to write a script.
package controlplane
