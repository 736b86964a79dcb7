package ipcache

import (
	"net/netip"
	"testing"

	"github.com/cilium/statedb"

	"github.com/cellium/cellium/statedb/ipcache"
	kvtables "github.com/cellium/cellium/statedb/kvstore"
	"github.com/cellium/cellium/statedb/nodes"
)

// The kvstore's ipcache entries: a row of source kvstore with the key's
// identity and host IP, over a CiliumEndpoint of the same address, under
// a local endpoint; an entry whose host IP is this node's gives nothing;
// incremental steps agree with FromScratch.
func TestDeriverKVStoreEntries(t *testing.T) {
	r := newTables(t)
	kvs, err := kvtables.NewIPCacheTable(r.DB)
	if err != nil {
		t.Fatal(err)
	}
	r.KVStore = kvs
	d := newDeriver(t, r)
	r.write(func(w statedb.WriteTxn) {
		_, _, _ = r.local.Insert(w, &nodes.LocalNode{Name: "n1", InternalIP: addr("192.168.0.1"), RouterIP: addr("10.1.0.1"),
			NodeAddresses: []nodes.Address{{Type: nodes.AddressInternalIP, IP: addr("192.168.0.1")}}})
		_, _, _ = r.nodes.Insert(w, &nodes.Node{Name: "n2", PodCIDRs: []netip.Prefix{pfx("10.2.0.0/24")},
			Addresses: []nodes.Address{{Type: nodes.AddressInternalIP, IP: addr("192.168.0.2")}}})
		_, _, _ = r.ids.Insert(w, cid(2000, "default"))
		_, _, _ = r.ceps.Insert(w, cep("default", "web", "192.168.0.2", 2000, "10.2.0.9"))
	})
	d.mustStep(t)
	if e, _, ok := r.IPCache.Get(r.DB.ReadTxn(), ipcache.PrefixIndex.Query(pfx("10.2.0.9/32"))); !ok || e.Source != ipcache.SourceCiliumEndpoint {
		t.Fatalf("before the key: %+v", e)
	}
	wtxn := r.DB.WriteTxn(kvs)
	_, _, _ = kvs.Insert(wtxn, &kvtables.IPEntry{Prefix: pfx("10.2.0.9/32"), Identity: 3000, HostIP: addr("192.168.0.2")})
	_, _, _ = kvs.Insert(wtxn, &kvtables.IPEntry{Prefix: pfx("10.2.0.10/32"), Identity: 3001, HostIP: addr("192.168.0.2")})
	// A key of this node (a previous run's): nothing.
	_, _, _ = kvs.Insert(wtxn, &kvtables.IPEntry{Prefix: pfx("10.1.0.50/32"), Identity: 3002, HostIP: addr("192.168.0.1")})
	wtxn.Commit()
	d.mustStep(t)
	txn := r.DB.ReadTxn()
	got := rows(txn, r.IPCache)
	for p, want := range map[string]*ipcache.Entry{
		"10.2.0.9/32":  {Identity: 3000, Source: ipcache.SourceKVStore, HostIP: addr("192.168.0.2")},
		"10.2.0.10/32": {Identity: 3001, Source: ipcache.SourceKVStore, HostIP: addr("192.168.0.2")},
	} {
		e, ok := got[pfx(p)]
		if !ok || e.Identity != want.Identity || e.Source != want.Source || e.HostIP != want.HostIP || e.Owner != "kvstore "+p {
			t.Errorf("%s: %+v, want %+v", p, e, want)
		}
	}
	if e, ok := got[pfx("10.1.0.50/32")]; ok {
		t.Errorf("a key of this node gave a row: %+v", e)
	}
	if s := diff(got, FromScratch(txn, r.Tables)); s != "" {
		t.Errorf("incremental and from scratch differ: %s", s)
	}
	// The key goes: the CEP's row is back.
	wtxn = r.DB.WriteTxn(kvs)
	_, _, _ = kvs.Delete(wtxn, &kvtables.IPEntry{Prefix: pfx("10.2.0.9/32")})
	wtxn.Commit()
	d.mustStep(t)
	if e, _, ok := r.IPCache.Get(r.DB.ReadTxn(), ipcache.PrefixIndex.Query(pfx("10.2.0.9/32"))); !ok || e.Source != ipcache.SourceCiliumEndpoint || e.Identity != 2000 {
		t.Errorf("after the key went: %+v", e)
	}
}
