package bpfprog_test

import (
	"errors"
	"testing"

	"github.com/cilium/statedb"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/statedb/bpfprog"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/reconciler"
)

func TestDerive(t *testing.T) {
	base := endpoints.Endpoint{ID: 7, HostIfName: "lxc1", HostIfIndex: 12, Identity: 1234, MAC: "0a:00:00:00:00:01",
		State: ciliumv2.EndpointStateReady}
	for _, tc := range []struct {
		name  string
		edit  func(*endpoints.Endpoint)
		audit bool
		want  *bpfprog.Program
	}{
		{name: "ready", want: &bpfprog.Program{EndpointID: 7, HostIfName: "lxc1", HostIfIndex: 12, Identity: 1234, MAC: "0a:00:00:00:00:01"}},
		{name: "audit", audit: true, want: &bpfprog.Program{EndpointID: 7, HostIfName: "lxc1", HostIfIndex: 12, Identity: 1234, MAC: "0a:00:00:00:00:01", AuditMode: true}},
		{name: "restoring keeps its programs", edit: func(e *endpoints.Endpoint) { e.State = ciliumv2.EndpointStateRestoring },
			want: &bpfprog.Program{EndpointID: 7, HostIfName: "lxc1", HostIfIndex: 12, Identity: 1234, MAC: "0a:00:00:00:00:01"}},
		{name: "no identity", edit: func(e *endpoints.Endpoint) { e.Identity = 0; e.State = ciliumv2.EndpointStateWaitingForIdentity }},
		{name: "no veth (health endpoint without one)", edit: func(e *endpoints.Endpoint) { e.HostIfName = ""; e.Health = true }},
		{name: "being deleted", edit: func(e *endpoints.Endpoint) { e.State = ciliumv2.EndpointStateDisconnecting }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ep := base
			if tc.edit != nil {
				tc.edit(&ep)
			}
			got := bpfprog.Derive(&ep, tc.audit)
			switch {
			case tc.want == nil && got != nil:
				t.Fatalf("Derive = %+v, want no row", got)
			case tc.want != nil && (got == nil || !got.SameAs(tc.want)):
				t.Fatalf("Derive = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestEndpointState(t *testing.T) {
	db := statedb.New()
	tbl, err := bpfprog.NewTable(db)
	if err != nil {
		t.Fatal(err)
	}
	ep := &endpoints.Endpoint{ID: 3, HostIfName: "lxc3", HostIfIndex: 30, Identity: 500, State: ciliumv2.EndpointStateRegenerating}
	check := func(want bpfprog.State, wantMsg string) {
		t.Helper()
		got, msg := bpfprog.EndpointState(db.ReadTxn(), tbl, ep)
		if got != want || msg != wantMsg {
			t.Fatalf("EndpointState = %v %q, want %v %q", got, msg, want, wantMsg)
		}
	}
	put := func(p *bpfprog.Program) {
		wtxn := db.WriteTxn(tbl)
		if _, _, err := tbl.Insert(wtxn, p); err != nil {
			t.Fatal(err)
		}
		wtxn.Commit()
	}
	check(bpfprog.StateNone, "")
	row := bpfprog.Derive(ep, false)
	put(row.WithStatus(reconciler.Pending()))
	check(bpfprog.StatePending, "")
	put(row.WithStatus(reconciler.Failed(errors.New("load program: permission denied"))))
	check(bpfprog.StateFailed, "load program: permission denied")
	put(row.WithStatus(reconciler.Done()))
	check(bpfprog.StateReady, "")
	// A new identity: the programs attached are those of the old one.
	ep2 := *ep
	ep2.Identity = 501
	ep = &ep2
	check(bpfprog.StatePending, "")
	put(row.WithStatus(reconciler.PendingDelete(errors.New("busy"))))
	check(bpfprog.StateNone, "")
}
