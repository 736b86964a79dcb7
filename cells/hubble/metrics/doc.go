// Package metrics is Hubble's flow metrics cell: it counts the flows the
// agent makes (a hubble.Sink) into Prometheus counters with Hubble's own
// names and labels (hubble_flows_processed_total, hubble_drop_total,
// hubble_policy_verdicts_total, hubble_tcp_flags_total,
// hubble_port_distribution_total, hubble_lost_events_total), chosen and
// shaped by --hubble-metrics, and serves them from a registry of their own on
// /metrics of --hubble-metrics-server.
//
// The parsing of --hubble-metrics (ParseSpecs), the counting (Metrics) and
// the HTTP handler are plain Go, usable without the hive.
package metrics
