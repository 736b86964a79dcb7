package endpointmanager

import (
	"context"
	"log/slog"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/statedb"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/statedb/bpfprog"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/mapstate"
	statepolicy "github.com/cellium/cellium/statedb/policy"
	"github.com/cellium/cellium/statedb/reconciler"
)

// TestNextState: each step of nextState, and that applying it repeatedly
// reaches ready at the computed revision through regenerating.
func TestNextState(t *testing.T) {
	const (
		ready   = ciliumv2.EndpointStateReady
		waiting = ciliumv2.EndpointStateWaitingToRegenerate
		regen   = ciliumv2.EndpointStateRegenerating
	)
	row := func(id uint32, rev, pending uint64) *statepolicy.EndpointPolicyRow {
		return &statepolicy.EndpointPolicyRow{EndpointID: 1, Identity: identity.NumericIdentity(id), Policy: &statepolicy.EndpointPolicy{Revision: rev}, PendingRevision: pending}
	}
	ep := func(s ciliumv2.EndpointState, rev uint64) *endpoints.Endpoint {
		return &endpoints.Endpoint{ID: 1, Identity: 1000, State: s, PolicyRevision: rev}
	}
	tests := []struct {
		name    string
		ep      *endpoints.Endpoint
		row     *statepolicy.EndpointPolicyRow
		want    ciliumv2.EndpointState
		wantRev uint64
		changed bool
	}{
		{"ready without a row waits", ep(ready, 3), nil, waiting, 3, true},
		{"row of the old identity: waits", ep(ready, 3), row(999, 3, 0), waiting, 3, true},
		{"pending row: waits", ep(ready, 3), row(1000, 3, 4), waiting, 3, true},
		{"already waiting: no change", ep(waiting, 3), row(1000, 3, 4), waiting, 3, false},
		{"computed: waiting regenerates", ep(waiting, 3), row(1000, 4, 0), regen, 3, true},
		{"computed, same revision (new identity): waiting regenerates", ep(waiting, 3), row(1000, 3, 0), regen, 3, true},
		{"regenerating takes the revision", ep(regen, 3), row(1000, 4, 0), ready, 4, true},
		{"ready, other revision computed: regenerates", ep(ready, 3), row(1000, 5, 0), regen, 3, true},
		{"ready at the computed revision: rest", ep(ready, 4), row(1000, 4, 0), ready, 4, false},
		{"restoring is the manager's", ep(ciliumv2.EndpointStateRestoring, 0), row(1000, 4, 0), ciliumv2.EndpointStateRestoring, 0, false},
		{"waiting-for-identity is the manager's", ep(ciliumv2.EndpointStateWaitingForIdentity, 0), nil, ciliumv2.EndpointStateWaitingForIdentity, 0, false},
		{"disconnecting is the manager's", ep(ciliumv2.EndpointStateDisconnecting, 4), nil, ciliumv2.EndpointStateDisconnecting, 4, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			step, changed := nextState(stateInputs{Endpoint: tt.ep, Policy: tt.row})
			if changed != tt.changed {
				t.Fatalf("changed = %v, want %v (step %+v)", changed, tt.changed, step)
			}
			if !changed {
				return
			}
			if step.State != tt.want || step.PolicyRevision != tt.wantRev || step.Message == "" {
				t.Errorf("step = %+v, want %s at revision %d with a message", step, tt.want, tt.wantRev)
			}
		})
	}

	// Restored after an agent restart: ready on the previous run's policy
	// until this run computes one, then a regeneration clears the mark,
	// even at an equal revision number.
	restored := ep(waiting, 1)
	restored.PolicyRestored = true
	step, changed := nextState(stateInputs{Endpoint: restored, Policy: nil})
	if !changed || step.State != ready || !step.PolicyRestored {
		t.Errorf("restored without a row: %+v, %v; want ready, still restored", step, changed)
	}
	restored = ep(ready, 1)
	restored.PolicyRestored = true
	if step, changed := nextState(stateInputs{Endpoint: restored, Policy: nil}); changed {
		t.Errorf("restored and ready without a row moved to %+v", step)
	}
	step, changed = nextState(stateInputs{Endpoint: restored, Policy: row(1000, 1, 0)})
	if !changed || step.State != regen || !step.PolicyRestored {
		t.Errorf("restored with a row at the same revision number: %+v, %v; want regenerating", step, changed)
	}
	restored = ep(regen, 1)
	restored.PolicyRestored = true
	step, _ = nextState(stateInputs{Endpoint: restored, Policy: row(1000, 1, 0)})
	if step.State != ready || step.PolicyRestored || step.PolicyRevision != 1 {
		t.Errorf("restored endpoint regenerated: %+v; want ready at 1, mark cleared", step)
	}

	// Identity being resolved for new labels: nothing moves.
	pend := ep(waiting, 3)
	pend.IdentityPending = true
	if step, changed := nextState(stateInputs{Endpoint: pend, Policy: row(1000, 4, 0)}); changed {
		t.Errorf("endpoint resolving its identity moved to %+v", step)
	}

	// From ready at 3, with revision 5 computed: regenerating, then ready at 5, then rest.
	cur := ep(ready, 3)
	var seen []ciliumv2.EndpointState
	for range 5 {
		step, changed := nextState(stateInputs{Endpoint: cur, Policy: row(1000, 5, 0)})
		if !changed {
			break
		}
		seen = append(seen, step.State)
		cur = ep(step.State, step.PolicyRevision)
	}
	if len(seen) != 2 || seen[0] != regen || seen[1] != ready || cur.PolicyRevision != 5 {
		t.Errorf("steps %v ending at revision %d, want [regenerating ready] at 5", seen, cur.PolicyRevision)
	}
}

// With the eBPF datapath, a regenerating endpoint is ready only once its
// programs are attached and its policy map holds the computed revision.
func TestNextStateWaitsForDatapath(t *testing.T) {
	ep := &endpoints.Endpoint{ID: 1, Identity: 1000, State: ciliumv2.EndpointStateRegenerating, PolicyRevision: 3}
	row := &statepolicy.EndpointPolicyRow{EndpointID: 1, Identity: 1000, Policy: &statepolicy.EndpointPolicy{Revision: 4}}
	pm := func(id identity.NumericIdentity, realized uint64) *mapstate.PolicyMap {
		return &mapstate.PolicyMap{EndpointID: 1, Identity: id, Revision: 4, Realized: realized}
	}
	tests := []struct {
		name  string
		in    stateInputs
		ready bool
	}{
		{"no datapath: ready", stateInputs{Programs: bpfprog.StateNone}, true},
		{"programs pending", stateInputs{Programs: bpfprog.StatePending}, false},
		{"programs failed", stateInputs{Programs: bpfprog.StateFailed}, false},
		{"programs attached, no map reconciler", stateInputs{Programs: bpfprog.StateReady}, true},
		{"policy map row missing", stateInputs{Programs: bpfprog.StateReady, WantsPolicyMap: true}, false},
		{"policy map at an older revision", stateInputs{Programs: bpfprog.StateReady, WantsPolicyMap: true, PolicyMap: pm(1000, 3)}, false},
		{"policy map of the old identity", stateInputs{Programs: bpfprog.StateReady, WantsPolicyMap: true, PolicyMap: pm(999, 4)}, false},
		{"policy map holds the revision", stateInputs{Programs: bpfprog.StateReady, WantsPolicyMap: true, PolicyMap: pm(1000, 4)}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := tt.in
			in.Endpoint, in.Policy = ep, row
			step, changed := nextState(in)
			if tt.ready != changed || (changed && (step.State != ciliumv2.EndpointStateReady || step.PolicyRevision != 4)) {
				t.Fatalf("nextState = %+v, %v; want ready at revision 4: %v", step, changed, tt.ready)
			}
			if reason := in.datapathReason(4); (reason == "") != tt.ready {
				t.Errorf("datapathReason = %q", reason)
			}
		})
	}
}

// A policy map that failed to take the computed revision (an overflow:
// the map fails closed and drops everything) makes a regenerating
// endpoint not-ready with the reconciler's error; the map taking a
// revision makes it ready, a newer revision makes it regenerate.
func TestNextStatePolicyMapFailed(t *testing.T) {
	const (
		ready    = ciliumv2.EndpointStateReady
		regen    = ciliumv2.EndpointStateRegenerating
		notReady = ciliumv2.EndpointStateNotReady
	)
	const overflow = "policy map of endpoint 1 (revision 4): 20000 entries do not fit the map (at most 16384): policy larger than the policy map"
	ep := func(s ciliumv2.EndpointState) *endpoints.Endpoint {
		return &endpoints.Endpoint{ID: 1, Identity: 1000, State: s, PolicyRevision: 3}
	}
	row := func(rev uint64) *statepolicy.EndpointPolicyRow {
		return &statepolicy.EndpointPolicyRow{EndpointID: 1, Identity: 1000, Policy: &statepolicy.EndpointPolicy{Revision: rev}}
	}
	pm := func(rev, realized uint64, st reconciler.Status) *mapstate.PolicyMap {
		return &mapstate.PolicyMap{EndpointID: 1, Identity: 1000, Revision: rev, Realized: realized, Status: st}
	}
	failed := reconciler.Status{Kind: reconciler.StatusError, Error: overflow}
	tests := []struct {
		name    string
		ep      *endpoints.Endpoint
		row     *statepolicy.EndpointPolicyRow
		pm      *mapstate.PolicyMap
		want    ciliumv2.EndpointState
		changed bool
	}{
		{"regenerating, the map refused the revision", ep(regen), row(4), pm(4, 3, failed), notReady, true},
		{"regenerating, an older revision failed", ep(regen), row(4), pm(3, 2, failed), regen, false},
		{"regenerating, the map pending", ep(regen), row(4), pm(4, 3, reconciler.Pending()), regen, false},
		{"not-ready, still failing", ep(notReady), row(4), pm(4, 3, failed), notReady, false},
		{"not-ready, the map took the revision", ep(notReady), row(4), pm(4, 4, reconciler.Done()), ready, true},
		{"not-ready, a newer revision computed", ep(notReady), row(5), pm(4, 3, failed), regen, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := stateInputs{Endpoint: tt.ep, Policy: tt.row, Programs: bpfprog.StateReady, WantsPolicyMap: true, PolicyMap: tt.pm}
			step, changed := nextState(in)
			if changed != tt.changed {
				t.Fatalf("changed = %v, want %v (step %+v)", changed, tt.changed, step)
			}
			if !changed {
				return
			}
			if step.State != tt.want {
				t.Errorf("state %s, want %s", step.State, tt.want)
			}
			if tt.want == notReady && !strings.Contains(step.Message, overflow) {
				t.Errorf("message %q does not carry the map's error", step.Message)
			}
		})
	}
	if !ep(notReady).InService() {
		t.Error("a not-ready endpoint is not in service: its labels and policy would not follow its pod")
	}
}

// TestNotReadyReason: the error of a create that timed out names what of
// its policy the endpoint still waits for.
func TestNotReadyReason(t *testing.T) {
	db := statedb.New()
	pols, err := statepolicy.NewTable(db)
	if err != nil {
		t.Fatal(err)
	}
	m := &Manager{db: db, policies: pols}
	ep := &endpoints.Endpoint{ID: 1, Identity: 1000, State: ciliumv2.EndpointStateWaitingToRegenerate}
	row := func(id identity.NumericIdentity, pending uint64) *statepolicy.EndpointPolicyRow {
		return &statepolicy.EndpointPolicyRow{EndpointID: 1, Identity: id, Policy: &statepolicy.EndpointPolicy{Revision: 3}, PendingRevision: pending}
	}
	tests := []struct {
		name string
		ep   *endpoints.Endpoint
		row  *statepolicy.EndpointPolicyRow
		want string
	}{
		{"no row", ep, nil, "the policy engine has written no policy for it"},
		{"row of another identity", ep, row(999, 0), "its policy row is for identity 999, not its own"},
		{"pending row", ep, row(1000, 4), "is being recomputed for revision 4"},
		{"computed row", ep, row(1000, 0), "its policy (revision 3) is computed, but its state was not derived from it"},
		{"labels changed", &endpoints.Endpoint{ID: 1, Identity: 1000, IdentityPending: true}, row(1000, 0), "identity is being resolved"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			txn := db.WriteTxn(pols)
			if err := pols.DeleteAll(txn); err != nil {
				t.Fatal(err)
			}
			if tt.row != nil {
				if _, _, err := pols.Insert(txn, tt.row); err != nil {
					t.Fatal(err)
				}
			}
			txn.Commit()
			if got := m.notReadyReason(db.ReadTxn(), tt.ep); !strings.Contains(got, tt.want) {
				t.Errorf("notReadyReason = %q, want it to say %q", got, tt.want)
			}
		})
	}
}

type nopHealth struct{}

func (nopHealth) OK(string)                  {}
func (nopHealth) Degraded(string, error)     {}
func (nopHealth) Stopped(string)             {}
func (h nopHealth) Scope(string) hive.Health { return h }

// TestDeriveStatesSeesMapWrittenBeforeSnapshot: a policy map that takes
// a regenerating endpoint's revision between the wake-up of the state
// deriver (by another endpoint's change) and its next snapshot makes the
// endpoint ready. The deriver used to decide whether the datapath tables
// changed before taking the snapshot: that change was then in the
// snapshot, so the watch channels taken from it never closed for it, and
// the endpoint stayed regenerating until some other policy map changed
// (a CNI ADD waited for it until RegenerationWait; TestModes in CI).
func TestDeriveStatesSeesMapWrittenBeforeSnapshot(t *testing.T) {
	db := statedb.New()
	eps, err := endpoints.NewTable(db)
	if err != nil {
		t.Fatal(err)
	}
	pols, err := statepolicy.NewTable(db)
	if err != nil {
		t.Fatal(err)
	}
	maps, err := mapstate.NewPoliciesTable(db)
	if err != nil {
		t.Fatal(err)
	}
	m := &Manager{log: slog.New(slog.DiscardHandler), db: db, table: eps, policies: pols, policyMaps: maps, now: time.Now}
	pol := &statepolicy.EndpointPolicyRow{EndpointID: 1, Identity: 1000, Policy: &statepolicy.EndpointPolicy{Revision: 1}}
	pm := mapstate.NewPolicyMap(pol)
	txn := db.WriteTxn(eps, pols, maps)
	x := (&endpoints.Endpoint{ID: 1, Identity: 1000, IPv4: netip.MustParseAddr("10.0.0.1")}).
		WithState(ciliumv2.EndpointStateRegenerating, "Regenerating endpoint", time.Now())
	for _, err := range []error{insert(txn, eps, x), insert(txn, pols, pol), insert(txn, maps, pm)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	txn.Commit()

	// Once armed, the next round first writes the map (as the policy map
	// reconciler does: Done, Realized = Revision), as if it came just
	// after the wake-up.
	var armed atomic.Bool
	d := &deriveStates{m: m, beforeRead: func() {
		if !armed.CompareAndSwap(true, false) {
			return
		}
		txn := db.WriteTxn(maps)
		if err := insert(txn, maps, pm.WithStatus(reconciler.Done())); err != nil {
			t.Error(err)
		}
		txn.Commit()
	}}
	if err := d.subscribe(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); d.run(ctx, nopHealth{}) }()
	t.Cleanup(func() { cancel(); <-done })

	state := func() ciliumv2.EndpointState {
		ep, _, _ := eps.Get(db.ReadTxn(), endpoints.IDIndex.Query(1))
		return ep.State
	}
	// The first round leaves it regenerating: its map is not written.
	time.Sleep(100 * time.Millisecond)
	if s := state(); s != ciliumv2.EndpointStateRegenerating {
		t.Fatalf("endpoint 1 is %s before its map is written", s)
	}
	// Another endpoint's change wakes the deriver.
	armed.Store(true)
	txn = db.WriteTxn(eps)
	y := (&endpoints.Endpoint{ID: 2, IPv4: netip.MustParseAddr("10.0.0.2")}).
		WithState(ciliumv2.EndpointStateWaitingForIdentity, "Endpoint created", time.Now())
	if err := insert(txn, eps, y); err != nil {
		t.Fatal(err)
	}
	txn.Commit()
	deadline := time.Now().Add(2 * time.Second)
	for state() != ciliumv2.EndpointStateReady {
		if time.Now().After(deadline) {
			t.Fatalf("endpoint 1 is still %s 2s after its policy map took revision 1", state())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func insert[T any](txn statedb.WriteTxn, t statedb.RWTable[T], obj T) error {
	_, _, err := t.Insert(txn, obj)
	return err
}
