// Package monitor reads what the eBPF datapath reports about the packets
// it handles: Reader turns the records of the cellium_events ring buffer
// into events of the node's monitor hub (statedb/monitor), and Collector
// exposes the per-reason counters of cellium_metrics as Prometheus metrics,
// read at scrape time, with Cilium's names and labels:
// cellium_drop_count_total{reason,direction},
// cellium_drop_bytes_total{reason,direction},
// cellium_forward_count_total{direction} and
// cellium_forward_bytes_total{direction}.
//
// The package is plain Go (no cells): daemon/datapathmonitor composes it
// into the agent. Decoding and Cilium's names come from datapath/maps.
package monitor
