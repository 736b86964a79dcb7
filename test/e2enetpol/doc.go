// Package e2enetpol runs the NetworkPolicy specs ("Netpol") of Kubernetes'
// own end-to-end suite, or sig-network's conformance specs ([Conformance]),
// against a cluster whose pods cellium networks: it
// selects the specs (Filter: a focus within Netpol, an optional skip, the
// SCTP specs left out with the reason when the kernel has no SCTP), lists
// them with a dry run of e2e.test, runs each in an e2e.test process of its
// own with a timeout, and reads Ginkgo's JSON reports into a Summary
// (passed, failed with the reason, skipped with the reason, run time).
//
// The suite's pods run the agnhost image, which Images packs from agnhost
// built from the same Kubernetes sources (no registry) under the exact
// name the suite asks for, for the conformance specs with this machine's
// shell, nc, curl, dig... (ToolFiles), and the other images they run;
// ImportImages loads them into a node's containerd. DNSRule finds what the
// running cluster lacks for the DNS-dependent specs. The binaries are built and cached by
// harness.EnsureE2EBinaries. test/cmd/e2enetpol (make e2e-netpol) is the
// command.
package e2enetpol
