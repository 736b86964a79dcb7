package lb

import (
	"net/netip"
	"testing"

	"github.com/cilium/statedb"
)

func TestL4AddrParseString(t *testing.T) {
	for _, s := range []string{"10.96.0.10:53/UDP", "10.96.0.1:443/TCP"} {
		a, err := ParseL4Addr(s)
		if err != nil || a.String() != s {
			t.Errorf("ParseL4Addr(%q) = %v, %v", s, a, err)
		}
	}
	for _, bad := range []string{"10.96.0.1:443", "10.96.0.1:443/SCTP", "[::1]:80/TCP", "x/TCP"} {
		if _, err := ParseL4Addr(bad); err == nil {
			t.Errorf("ParseL4Addr(%q) accepted", bad)
		}
	}
}

// The tables index frontends by address and Service, backends by address
// and ID; `cellium statedb lb-frontends 10.96.0.10:53/UDP` queries by
// the address's string form.
func TestTables(t *testing.T) {
	db := statedb.New()
	fe, err := NewFrontendsTable(db)
	if err != nil {
		t.Fatal(err)
	}
	be, err := NewBackendsTable(db)
	if err != nil {
		t.Fatal(err)
	}
	a := L4Addr{Addr: netip.MustParseAddr("10.96.0.10"), Port: 53, Proto: UDP}
	b := L4Addr{Addr: netip.MustParseAddr("10.0.0.7"), Port: 53, Proto: UDP}
	wtxn := db.WriteTxn(fe, be)
	_, _, _ = fe.Insert(wtxn, &Frontend{Address: a, Service: "kube-system/kube-dns", Backends: []L4Addr{b}, BackendIDs: []uint32{3}})
	_, _, _ = fe.Insert(wtxn, &Frontend{Address: L4Addr{Addr: a.Addr, Port: 53, Proto: TCP}, Service: "kube-system/kube-dns"})
	_, _, _ = be.Insert(wtxn, &Backend{Address: b, ID: 3})
	txn := wtxn.Commit()
	if f, _, ok := fe.Get(txn, FrontendAddressIndex.Query(a)); !ok || f.Address != a {
		t.Errorf("frontend %v: %v", a, f)
	}
	n := 0
	for range fe.List(txn, FrontendServiceIndex.Query("kube-system/kube-dns")) {
		n++
	}
	if n != 2 {
		t.Errorf("%d frontends of kube-dns, want 2", n)
	}
	if r, _, ok := be.Get(txn, BackendIDIndex.Query(3)); !ok || r.Address != b {
		t.Errorf("backend 3: %v", r)
	}
	k, err := FrontendAddressIndex.FromString("10.96.0.10:53/UDP")
	if err != nil || string(k) != string(a.key()) {
		t.Errorf("FromString: %v, %v", k, err)
	}
	row := (&Frontend{Address: a, Service: "kube-system/kube-dns", PortName: "dns", Backends: []L4Addr{b}, BackendIDs: []uint32{3}}).TableRow()
	if row[0] != "10.96.0.10:53/UDP" || row[1] != "kube-system/kube-dns:dns" || row[2] != "None" || row[3] != "10.0.0.7:53#3" {
		t.Errorf("table row %q", row)
	}
	row = (&Frontend{Address: a, SessionAffinity: true, AffinityTimeout: 600}).TableRow()
	if row[2] != "ClientIP 600s" {
		t.Errorf("table row with session affinity %q", row)
	}
}
