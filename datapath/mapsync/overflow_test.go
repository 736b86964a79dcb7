package mapsync

import (
	"slices"
	"strings"
	"testing"

	"github.com/cilium/statedb"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/mapstate"
	"github.com/cellium/cellium/statedb/policy"
	"github.com/cellium/cellium/statedb/reconciler"
)

// asPolicy reads a policy map's content back as the policy of one
// direction, to ask it for verdicts the way the datapath decides.
func asPolicy(m map[policy.Key]PolicyValue, dir policy.Direction) *policy.DirectionPolicy {
	d := &policy.DirectionPolicy{Enforcing: true}
	for k, v := range m {
		if k.Direction == dir {
			d.Entries = append(d.Entries, policy.Entry{Key: k, Deny: v.Deny})
		}
	}
	slices.SortFunc(d.Entries, func(a, b policy.Entry) int { return a.Key.Compare(b.Key) })
	return d
}

// The attack: a victim endpoint allows everything; a tenant adds a deny
// of its identity and, by creating identities that another rule selects,
// makes the victim's policy larger than its map. The map must not go on
// allowing what the new policy denies: it holds the deny entries alone
// (everything else drops), the row says why, the endpoint counts as
// overflowing; once the policy fits again, it is written as usual.
func TestPolicyMapOverflowFailsClosed(t *testing.T) {
	const capacity = 8
	e := newEnv(t, 0, func(e *env, tg targets) { tg.pol.(*fakePolicyMaps).max = capacity })
	pm := tableWatch(e.db, statedb.Table[*mapstate.PolicyMap](e.tables.PolicyMap))
	const attacker = identity.NumericIdentity(666)
	allowAll := policy.Entry{Key: key(0, policy.Ingress, 0, 0)}
	e.write(func(w statedb.WriteTxn) {
		_, _, _ = e.eps.Insert(w, &endpoints.Endpoint{ID: 5, IPv4: addr("10.1.0.5"), Identity: 1234})
		_, _, _ = e.pols.Insert(w, policyRow(5, 1, []policy.Entry{allowAll}))
	})
	waitFor(t, "revision 1 (allow-all)", func() bool { row, ok := policyMapRow(e, 5); return ok && row.Realized == 1 }, pm)
	m, _ := e.polMaps.get(5)
	if ok, _ := asPolicy(m.snapshot(), policy.Ingress).Verdict(attacker, policy.ProtoTCP, 80); !ok {
		t.Fatal("revision 1 does not allow the attacker's identity: the test is wrong")
	}

	// Revision 2: deny the attacker on TCP/80, allow web from many
	// identities: 1 deny + capacity allows + the egress allow-all.
	deny := policy.Entry{Key: key(attacker, policy.Ingress, policy.ProtoTCP, 80), Deny: true}
	big := []policy.Entry{deny}
	for i := range identity.NumericIdentity(capacity) {
		big = append(big, policy.Entry{Key: key(2000+i, policy.Ingress, policy.ProtoTCP, 80)})
	}
	slices.SortFunc(big, func(a, b policy.Entry) int { return a.Key.Compare(b.Key) })
	e.write(func(w statedb.WriteTxn) { _, _, _ = e.pols.Insert(w, policyRow(5, 2, big)) })
	waitFor(t, "revision 2 refused", func() bool {
		row, ok := policyMapRow(e, 5)
		return ok && row.Revision == 2 && row.Status.Kind == reconciler.StatusError
	}, pm)
	row, _ := policyMapRow(e, 5)
	if !strings.Contains(row.Status.Error, ErrPolicyTooLarge.Error()) || !strings.Contains(row.Status.Error, "drops all traffic") {
		t.Errorf("status %q does not say the policy is too large and what the map does", row.Status.Error)
	}
	if row.RealizedAt(2) {
		t.Errorf("revision 2 realized (%d) although it does not fit", row.Realized)
	}
	got := m.snapshot()
	if ok, by := asPolicy(got, policy.Ingress).Verdict(attacker, policy.ProtoTCP, 80); ok {
		t.Errorf("the map still lets the denied identity in (by %s): %v", by, got)
	}
	for k, v := range got {
		if !v.Deny {
			t.Errorf("allow entry %s left in an overflowing map", k)
		}
	}
	if v, ok := got[deny.Key]; !ok || !v.Deny {
		t.Errorf("the deny entry is missing: %v", got)
	}
	if ids := e.polOps.Overflowing(); !slices.Equal(ids, []uint16{5}) {
		t.Errorf("overflowing endpoints %v, want [5]", ids)
	}
	if n := overflowMetric(t, e.polOps); n != 1 {
		t.Errorf("cellium_policy_map_overflow_endpoints = %v, want 1", n)
	}

	// Revision 3 fits again: written as usual, the overflow is over.
	small := []policy.Entry{deny, {Key: key(2000, policy.Ingress, policy.ProtoTCP, 80)}}
	e.write(func(w statedb.WriteTxn) { _, _, _ = e.pols.Insert(w, policyRow(5, 3, small)) })
	waitFor(t, "revision 3", func() bool {
		row, ok := policyMapRow(e, 5)
		return ok && row.Realized == 3 && row.Status.Kind == reconciler.StatusDone
	}, pm)
	got = m.snapshot()
	if want := Entries(policyRow(5, 3, small).Policy); len(got) != len(want) {
		t.Errorf("map at revision 3: %v, want %v", got, want)
	}
	if ok, _ := asPolicy(got, policy.Ingress).Verdict(2000, policy.ProtoTCP, 80); !ok {
		t.Errorf("revision 3 does not allow identity 2000: %v", got)
	}
	if ids := e.polOps.Overflowing(); len(ids) != 0 {
		t.Errorf("overflowing endpoints %v after the policy fits", ids)
	}
	if n := overflowMetric(t, e.polOps); n != 0 {
		t.Errorf("cellium_policy_map_overflow_endpoints = %v after the policy fits, want 0", n)
	}
}

// Denies alone that do not fit leave the map empty: it drops everything.
// The endpoint's deletion ends its overflow.
func TestPolicyMapOverflowOfDenies(t *testing.T) {
	const capacity = 4
	e := newEnv(t, 0, func(e *env, tg targets) { tg.pol.(*fakePolicyMaps).max = capacity })
	pm := tableWatch(e.db, statedb.Table[*mapstate.PolicyMap](e.tables.PolicyMap))
	var denies []policy.Entry
	for i := range identity.NumericIdentity(capacity + 1) {
		denies = append(denies, policy.Entry{Key: key(3000+i, policy.Ingress, 0, 0), Deny: true})
	}
	e.write(func(w statedb.WriteTxn) {
		_, _, _ = e.eps.Insert(w, &endpoints.Endpoint{ID: 7, IPv4: addr("10.1.0.7"), Identity: 1234})
		_, _, _ = e.pols.Insert(w, policyRow(7, 1, []policy.Entry{{Key: key(0, policy.Ingress, 0, 0)}}))
	})
	waitFor(t, "revision 1", func() bool { row, ok := policyMapRow(e, 7); return ok && row.Realized == 1 }, pm)
	e.write(func(w statedb.WriteTxn) { _, _, _ = e.pols.Insert(w, policyRow(7, 2, denies)) })
	waitFor(t, "revision 2 refused", func() bool {
		row, ok := policyMapRow(e, 7)
		return ok && row.Revision == 2 && row.Status.Kind == reconciler.StatusError
	}, pm)
	m, _ := e.polMaps.get(7)
	if got := m.snapshot(); len(got) != 0 {
		t.Errorf("map of denies that do not fit: %v, want empty", got)
	}
	if ids := e.polOps.Overflowing(); !slices.Equal(ids, []uint16{7}) {
		t.Errorf("overflowing endpoints %v, want [7]", ids)
	}
	e.write(func(w statedb.WriteTxn) { _, _, _ = e.eps.Delete(w, &endpoints.Endpoint{ID: 7}) })
	waitFor(t, "map removed", func() bool { _, ok := e.polMaps.get(7); return !ok }, e.polMaps.watch)
	if ids := e.polOps.Overflowing(); len(ids) != 0 {
		t.Errorf("overflowing endpoints %v after the endpoint's deletion", ids)
	}
}

// overflowMetric is the value of cellium_policy_map_overflow_endpoints.
func overflowMetric(t *testing.T, ops *PolicyOps) float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(NewPolicyCollector(ops))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "cellium_policy_map_overflow_endpoints" && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no cellium_policy_map_overflow_endpoints in %v", mfs)
	return 0
}

// Writing the deny entries of an overflowing policy fails: the allow
// entries are gone already (they are deleted first), the row says the
// policy is too large, and the endpoint counts as overflowing.
func TestPolicyMapOverflowWriteFails(t *testing.T) {
	const capacity = 4
	e := newEnv(t, 0, func(e *env, tg targets) { tg.pol.(*fakePolicyMaps).max = capacity })
	pm := tableWatch(e.db, statedb.Table[*mapstate.PolicyMap](e.tables.PolicyMap))
	e.write(func(w statedb.WriteTxn) {
		_, _, _ = e.eps.Insert(w, &endpoints.Endpoint{ID: 5, IPv4: addr("10.1.0.5"), Identity: 1234})
		_, _, _ = e.pols.Insert(w, policyRow(5, 1, []policy.Entry{{Key: key(0, policy.Ingress, 0, 0)}}))
	})
	waitFor(t, "revision 1", func() bool { row, ok := policyMapRow(e, 5); return ok && row.Realized == 1 }, pm)
	m, _ := e.polMaps.get(5)
	m.fail(-1)
	big := []policy.Entry{{Key: key(666, policy.Ingress, 0, 0), Deny: true}}
	for i := range identity.NumericIdentity(capacity) {
		big = append(big, policy.Entry{Key: key(2000+i, policy.Ingress, policy.ProtoTCP, 80)})
	}
	slices.SortFunc(big, func(a, b policy.Entry) int { return a.Key.Compare(b.Key) })
	e.write(func(w statedb.WriteTxn) { _, _, _ = e.pols.Insert(w, policyRow(5, 2, big)) })
	waitFor(t, "revision 2 refused", func() bool {
		row, ok := policyMapRow(e, 5)
		return ok && row.Revision == 2 && row.Status.Kind == reconciler.StatusError &&
			strings.Contains(row.Status.Error, ErrPolicyTooLarge.Error()) && strings.Contains(row.Status.Error, errInjected.Error())
	}, pm)
	for k, v := range m.snapshot() {
		if !v.Deny {
			t.Errorf("allow entry %s left although writing the denies failed", k)
		}
	}
	if ids := e.polOps.Overflowing(); !slices.Equal(ids, []uint16{5}) {
		t.Errorf("overflowing endpoints %v, want [5]", ids)
	}
	m.fail(0)
	waitFor(t, "the deny written on a retry", func() bool {
		_, ok := m.snapshot()[big[0].Key]
		return ok
	}, e.polMaps.watch)
}
