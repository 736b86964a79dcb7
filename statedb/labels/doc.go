// Package labels owns cellium's model of security labels, the input from
// which numeric security identities are derived.
//
// A Label is a (source, key, value) triple written as "source:key=value",
// for example "k8s:app=web" or "reserved:host". The textual forms are the
// compatibility surface with Cilium: they appear in CiliumEndpoint status,
// in CiliumIdentity "security-labels", in kvstore identity keys and on the
// command line, so parsing and printing follow Cilium's rules exactly,
// including its corner cases (see Parse).
//
// Labels is an immutable set of labels with at most one label per key,
// kept sorted by key. Its SortedList form ("source:key=value;" for each
// label, in key order) is the canonical identity key: two label sets get the
// same identity exactly when their SortedList strings are equal.
//
// FromK8sPod turns a pod's Kubernetes metadata into labels, and Filter
// decides which of them are relevant for the identity (the --labels and
// --label-prefix-file agent options; DefaultFilter is the built-in list).
//
// The package is plain Go: no goroutines, no global mutable state.
package labels
