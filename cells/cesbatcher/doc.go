// Package cesbatcher is the operator's CiliumEndpointSlice batcher
// (--enable-cilium-endpoint-slice). While this replica leads, it keeps
// one CiliumEndpointSlice entry for every CiliumEndpoint of the cluster:
// endpoints of one namespace and one security identity share slices
// (Cilium's "identity" slice mode) of at most
// --ces-max-ciliumendpoints-per-ces entries each. An endpoint that goes
// leaves its slice, one whose identity changes moves to a slice of its new
// identity, and a slice left empty is deleted. The CiliumEndpoints are the
// truth: a slice entry that disagrees with its CiliumEndpoint is
// rewritten. Changes are coalesced into rounds of writes (a round once
// the CiliumEndpoints are quiet for half a second, at most two seconds
// after a change or the start of the round it came during: a burst of
// pods costs a few slice writes, not one per pod). A round's writes go
// several at once, each through a token bucket whose rate and burst
// follow the number of CiliumNodes (--ces-rate-limits, Cilium v1.20's
// steps by cluster size; the deprecated --ces-write-qps-limit and
// --ces-write-qps-burst make one step), on the operator's client, whose
// own rate (--operator-k8s-client-qps, 100 by default) is above the
// bucket's.
//
// On start (and on gaining leadership) it adopts the slices that exist:
// each endpoint found in a slice of its namespace and identity stays
// there, so a restarted operator neither duplicates nor reshuffles
// entries. Slices it cannot adopt are rewritten or deleted.
//
// Batcher is the plain logic (no I/O); Syncer applies its result.
package cesbatcher
