package loader

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/statedb"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/statedb/bpfprog"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/reconciler"
)

func TestParseMAC(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string
		bad  bool
	}{
		{in: "", want: ""},
		{in: "0a:1b:2c:3d:4e:5f", want: "0a:1b:2c:3d:4e:5f"},
		{in: "0a:1b:2c", bad: true},
		{in: "00:00:00:00:fe:80:00:00:00:00:00:00:02:00:5e:10:00:00:00:01", bad: true}, // 20 bytes
		{in: "not a mac", bad: true},
	} {
		got, err := parseMAC(tc.in)
		if (err != nil) != tc.bad || got.String() != tc.want {
			t.Errorf("parseMAC(%q) = %v, %v; want %q (error %v)", tc.in, got, err, tc.want, tc.bad)
		}
	}
}

func TestVerifierLogKeepsTheEnd(t *testing.T) {
	var lines []string
	for i := range 500 {
		lines = append(lines, fmt.Sprintf("%d: (b7) r0 = %d ; R0_w=%d", i, i, i))
	}
	lines = append(lines, "R5 !read_ok", "processed 501 insns")
	err := fmt.Errorf("load program: %w", &ebpf.VerifierError{Cause: errors.New("permission denied"), Log: lines})
	got := VerifierLog(err)
	if !strings.Contains(got, "R5 !read_ok") || !strings.Contains(got, "permission denied") {
		t.Errorf("log lacks the cause or the last lines:\n%s", got)
	}
	if strings.Contains(got, "0: (b7) r0 = 0 ;") || len(got) > verifierLogBytes+200 {
		t.Errorf("log not trimmed (%d bytes):\n%s", len(got), got)
	}
	if e := loadError(err); !errors.Is(e, ErrVerifier) || !strings.Contains(e.Error(), "R5 !read_ok") {
		t.Errorf("loadError = %v", e)
	}
	if VerifierLog(errors.New("other")) != "" {
		t.Error("VerifierLog of a non-verifier error is not empty")
	}
}

// waitRows waits until the programs table's rows (all of them) satisfy
// ok, watching the table.
func waitRows(t *testing.T, db *statedb.DB, tbl statedb.Table[*bpfprog.Program], ok func([]*bpfprog.Program) bool) []*bpfprog.Program {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		it, watch := tbl.AllWatch(db.ReadTxn())
		var rows []*bpfprog.Program
		for r := range it {
			rows = append(rows, r)
		}
		if ok(rows) {
			return rows
		}
		select {
		case <-watch:
		case <-deadline:
			t.Fatalf("programs table never matched; rows: %+v", rows)
		}
	}
}

// fakeOps records what the reconciler asks and fails on demand.
type fakeOps struct {
	fail    map[uint16]error
	updates chan uint16
	deletes chan uint16
}

func (f *fakeOps) Update(_ context.Context, _ statedb.ReadTxn, p *bpfprog.Program) error {
	f.updates <- p.EndpointID
	return f.fail[p.EndpointID]
}

func (f *fakeOps) Delete(_ context.Context, _ statedb.ReadTxn, p *bpfprog.Program) error {
	f.deletes <- p.EndpointID
	return nil
}

func (f *fakeOps) Prune(context.Context, statedb.ReadTxn, iter.Seq2[*bpfprog.Program, statedb.Revision]) error {
	return nil
}

// TestDeriverFollowsEndpoints runs the deriver and the reconciler (over
// fake operations): an endpoint gets a row once it has a veth and an
// identity, the row follows its identity, the status of a failed load is
// in the row, the table is initialized only after the endpoints table,
// and the row goes with the endpoint.
func TestDeriverFollowsEndpoints(t *testing.T) {
	db := statedb.New()
	eps, err := endpoints.NewTable(db)
	if err != nil {
		t.Fatal(err)
	}
	progs, err := bpfprog.NewTable(db)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Start(); err != nil {
		t.Fatal(err)
	}
	defer db.Stop()
	wtxn := db.WriteTxn(eps)
	epsInit := eps.RegisterInitializer(wtxn, "test-restore")
	wtxn.Commit()

	tables := Tables{DB: db, Endpoints: eps, Programs: progs}
	d := NewDeriver(tables, true)
	ops := &fakeOps{fail: map[uint16]error{2: fmt.Errorf("%w: R5 !read_ok", ErrVerifier)},
		updates: make(chan uint16, 100), deletes: make(chan uint16, 100)}
	cfg := reconciler.Config[*bpfprog.Program]{
		Name: bpfprog.TableName, Table: progs, Operations: ops,
		GetStatus: func(p *bpfprog.Program) reconciler.Status { return p.Status },
		SetStatus: (*bpfprog.Program).WithStatus, RetryMin: time.Hour,
	}
	r, err := reconciler.New(db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Subscribe(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	go func() { d.Run(ctx, nopHealth{}); done <- struct{}{} }()
	go func() { r.Run(ctx, nopHealth{}); done <- struct{}{} }()
	defer func() { cancel(); <-done; <-done }()

	put := func(e *endpoints.Endpoint) {
		wtxn := db.WriteTxn(eps)
		if _, _, err := eps.Insert(wtxn, e); err != nil {
			t.Fatal(err)
		}
		wtxn.Commit()
	}
	put(&endpoints.Endpoint{ID: 1, IPv4: mustAddr("10.0.0.1"), HostIfName: "lxc1", HostIfIndex: 11, Identity: 1000, MAC: "0a:00:00:00:00:01", State: ciliumv2.EndpointStateRestoring})
	put(&endpoints.Endpoint{ID: 2, IPv4: mustAddr("10.0.0.2"), HostIfName: "lxc2", HostIfIndex: 12, Identity: 1001, State: ciliumv2.EndpointStateRegenerating})
	put(&endpoints.Endpoint{ID: 3, IPv4: mustAddr("10.0.0.3"), HostIfName: "lxc3", State: ciliumv2.EndpointStateWaitingForIdentity})
	rows := waitRows(t, db, progs, func(rs []*bpfprog.Program) bool {
		return len(rs) == 2 && rs[0].Status.Kind == reconciler.StatusDone && rs[1].Status.Kind == reconciler.StatusError
	})
	if !rows[0].AuditMode || rows[0].HostIfName != "lxc1" || rows[0].Identity != 1000 || rows[0].MAC != "0a:00:00:00:00:01" {
		t.Errorf("row of endpoint 1: %+v", rows[0])
	}
	if !strings.Contains(rows[1].Status.Error, "R5 !read_ok") {
		t.Errorf("row of endpoint 2: status %s, want the verifier's log", rows[1].Status)
	}
	if ok, _ := progs.Initialized(db.ReadTxn()); ok {
		t.Error("programs table initialized before the endpoints table (a prune could remove restored programs)")
	}
	wtxn = db.WriteTxn(eps)
	epsInit(wtxn)
	wtxn.Commit()
	for {
		ok, w := progs.Initialized(db.ReadTxn())
		if ok {
			break
		}
		<-w
	}

	// Endpoint 3 gets its identity; endpoint 1 a new one; 2 goes.
	put(&endpoints.Endpoint{ID: 3, IPv4: mustAddr("10.0.0.3"), HostIfName: "lxc3", Identity: 1002, State: ciliumv2.EndpointStateRegenerating})
	put(&endpoints.Endpoint{ID: 1, IPv4: mustAddr("10.0.0.1"), HostIfName: "lxc1", HostIfIndex: 11, Identity: 1005, State: ciliumv2.EndpointStateRegenerating})
	wtxn = db.WriteTxn(eps)
	_, _, _ = eps.Delete(wtxn, &endpoints.Endpoint{ID: 2})
	wtxn.Commit()
	rows = waitRows(t, db, progs, func(rs []*bpfprog.Program) bool {
		return len(rs) == 2 && rs[0].Identity == 1005 && rs[1].EndpointID == 3 &&
			rs[0].Status.Kind == reconciler.StatusDone && rs[1].Status.Kind == reconciler.StatusDone
	})
	deleted := false
	for !deleted {
		select {
		case id := <-ops.deletes:
			deleted = id == 2
		case <-time.After(10 * time.Second):
			t.Fatal("the programs of endpoint 2 were never deleted")
		}
	}
	if rows[1].Identity != 1002 {
		t.Errorf("row of endpoint 3: %+v", rows[1])
	}
}

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }
