package mapsync

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/cilium/statedb"

	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/ipcache"
	"github.com/cellium/cellium/statedb/mapstate"
	"github.com/cellium/cellium/statedb/policy"
	"github.com/cellium/cellium/statedb/reconciler"
	"github.com/cellium/cellium/test/privileged"
)

// benchPolicy is a policy of n ingress entries whose identities start at
// base (so that two bases far apart share no entry) plus the egress
// allow-all.
func benchPolicy(ep uint16, rev uint64, base, n int) *policy.EndpointPolicyRow {
	entries := make([]policy.Entry, n)
	for i := range entries {
		entries[i] = policy.Entry{Key: policy.NewKey(identity.NumericIdentity(base+i/4), policy.Ingress, policy.ProtoTCP, uint16(80+i%4), 16)}
	}
	return policyRow(ep, rev, entries)
}

// BenchmarkPrivilegedPolicyMapUpdate measures a 10k-entry policy map
// update through the whole path (endpoint-policies row -> deriver ->
// policy-maps row -> reconciler -> pinned map): each iteration replaces
// the endpoint's policy by one sharing no entry with it (10k entries
// written, 10k deleted, the map never empty) and waits until the row says
// the map holds the new revision. It reports map entries changed per
// second.
func BenchmarkPrivilegedPolicyMapUpdate(b *testing.B) {
	privileged.Require(b)
	const n = 10000
	r := openReal(b)
	e := newEnvWith(b, 0, nil, r.tg)
	pm := tableWatch(e.db, statedb.Table[*mapstate.PolicyMap](e.tables.PolicyMap))
	realized := func(rev uint64) {
		waitFor(b, fmt.Sprintf("revision %d realized", rev), func() bool {
			row, ok := policyMapRow(e, 7)
			if ok && row.Status.Kind == reconciler.StatusError {
				b.Fatalf("policy map update failed: %s", row.Status.Error)
			}
			return ok && row.Realized == rev
		}, pm)
	}
	e.write(func(w statedb.WriteTxn) {
		_, _, _ = e.eps.Insert(w, &endpoints.Endpoint{ID: 7, IPv4: addr("10.1.0.7"), Identity: 1234})
		_, _, _ = e.pols.Insert(w, benchPolicy(7, 1, 100000, n))
	})
	realized(1)
	b.ResetTimer()
	for i := range b.N {
		rev := uint64(i + 2)
		e.write(func(w statedb.WriteTxn) { _, _, _ = e.pols.Insert(w, benchPolicy(7, rev, 100000+int(rev%2)*n, n)) })
		realized(rev)
	}
	b.StopTimer()
	b.ReportMetric(float64(2*n*b.N)/b.Elapsed().Seconds(), "entries/s")
	m, err := r.tg.pol.Open(7)
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	if got, err := m.Dump(); err != nil || len(got) != n+1 {
		b.Fatalf("the map holds %d entries (%v), want %d", len(got), err, n+1)
	}
}

// BenchmarkPrivilegedIPCache50k measures the ipcache reconciler: each
// iteration inserts 50,000 prefix rows and waits until every row's status
// is Done (batches of RoundLimit into the pinned LPM trie), then deletes
// them (not timed) and waits until the map is empty. It reports prefixes
// programmed per second.
func BenchmarkPrivilegedIPCache50k(b *testing.B) {
	privileged.Require(b)
	const n = 50000
	r := openReal(b)
	e := newEnvWith(b, 0, nil, r.tg)
	rows := make([]*ipcache.Entry, n)
	for i := range rows {
		a := netip.AddrFrom4([4]byte{10, byte(100 + i>>16), byte(i >> 8), byte(i)})
		rows[i] = &ipcache.Entry{Prefix: netip.PrefixFrom(a, 32), Identity: identity.NumericIdentity(1000 + i%500),
			Source: ipcache.SourceCiliumEndpoint, Status: reconciler.Pending()}
	}
	done := func() bool {
		txn := e.db.ReadTxn()
		if e.ipc.NumObjects(txn) != n {
			return false
		}
		for row := range e.ipc.All(txn) {
			if row.Status.Kind != reconciler.StatusDone {
				return false
			}
		}
		return true
	}
	b.ResetTimer()
	for range b.N {
		e.write(func(w statedb.WriteTxn) {
			for _, row := range rows {
				_, _, _ = e.ipc.Insert(w, row)
			}
		})
		waitFor(b, "50k prefixes done", done, tableWatch(e.db, statedb.Table[*ipcache.Entry](e.ipc)))
		b.StopTimer()
		e.write(func(w statedb.WriteTxn) { _ = e.ipc.DeleteAll(w) })
		waitFor(b, "ipcache map empty", func() bool { return len(r.ipcache(b)) == 0 }, r.n.watch)
		b.StartTimer()
	}
	b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "prefixes/s")
}

// BenchmarkPrivilegedIPCacheOps50k measures the map side alone: 50,000
// prefixes written by the ipcache operations' UpdateBatch in batches of
// 10,000 (the reconciler's RoundLimit) into the pinned LPM trie, without
// statedb. The deletion after each iteration is not timed.
func BenchmarkPrivilegedIPCacheOps50k(b *testing.B) {
	privileged.Require(b)
	const n, batch = 50000, 10000
	r := openReal(b)
	ops := NewIPCacheOps(IPCacheMap(r.m.IPCache))
	entries := make([]reconciler.BatchEntry[*ipcache.Entry], n)
	for i := range entries {
		a := netip.AddrFrom4([4]byte{10, byte(100 + i>>16), byte(i >> 8), byte(i)})
		entries[i].Object = &ipcache.Entry{Prefix: netip.PrefixFrom(a, 32), Identity: identity.NumericIdentity(1000 + i%500)}
	}
	b.ResetTimer()
	for range b.N {
		for lo := 0; lo < n; lo += batch {
			chunk := entries[lo : lo+batch]
			ops.UpdateBatch(b.Context(), nil, chunk)
			for _, e := range chunk {
				if e.Result != nil {
					b.Fatal(e.Result)
				}
			}
		}
		b.StopTimer()
		ops.DeleteBatch(b.Context(), nil, entries)
		b.StartTimer()
	}
	b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "prefixes/s")
}
