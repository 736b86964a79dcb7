package mapsync

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/statedb"

	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/mapstate"
	"github.com/cellium/cellium/statedb/policy"
	"github.com/cellium/cellium/statedb/reconciler"
	"github.com/cellium/cellium/test/privileged"
)

// The attack of TestPolicyMapOverflowFailsClosed on a real pinned policy
// map of its real capacity: an allow-all endpoint gets a policy with a
// deny and more allows than the map holds; the map ends with the deny
// alone (bpftool counts 1 entry), then takes a policy that fits again.
func TestPrivilegedPolicyMapOverflow(t *testing.T) {
	privileged.Require(t)
	r := openReal(t)
	e := newEnvWith(t, 0, nil, r.tg)
	pm := tableWatch(e.db, statedb.Table[*mapstate.PolicyMap](e.tables.PolicyMap))
	e.write(func(w statedb.WriteTxn) {
		_, _, _ = e.eps.Insert(w, &endpoints.Endpoint{ID: 5, IPv4: addr("10.1.0.5"), Identity: 1234})
		_, _, _ = e.pols.Insert(w, policyRow(5, 1, []policy.Entry{{Key: key(0, policy.Ingress, 0, 0)}}))
	})
	waitFor(t, "revision 1 (allow-all)", func() bool { row, ok := policyMapRow(e, 5); return ok && row.Realized == 1 }, pm)
	pmap, err := maps.OpenPolicyMap(r.dir, 5)
	if err != nil {
		t.Fatal(err)
	}
	defer pmap.Close()
	capacity := int(pmap.Map().MaxEntries())

	deny := policy.Entry{Key: key(666, policy.Ingress, policy.ProtoTCP, 80), Deny: true}
	big := []policy.Entry{deny}
	for i := range identity.NumericIdentity(capacity) {
		big = append(big, policy.Entry{Key: key(100000+i, policy.Ingress, policy.ProtoTCP, 80)})
	}
	start := time.Now()
	e.write(func(w statedb.WriteTxn) { _, _, _ = e.pols.Insert(w, policyRow(5, 2, big)) })
	waitFor(t, "revision 2 refused", func() bool {
		row, ok := policyMapRow(e, 5)
		return ok && row.Revision == 2 && row.Status.Kind == reconciler.StatusError
	}, pm)
	t.Logf("a policy of %d entries for a map of %d refused in %v", len(big)+1, capacity, time.Since(start))
	if row, _ := policyMapRow(e, 5); !strings.Contains(row.Status.Error, ErrPolicyTooLarge.Error()) {
		t.Errorf("status %q", row.Status.Error)
	}
	got := map[policy.Key]bool{}
	if err := pmap.Iterate(func(e policy.Entry) bool { got[e.Key] = e.Deny; return true }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || !got[deny.Key] {
		t.Errorf("overflowing map holds %v, want the deny alone", got)
	}
	if n := bpftoolCount(t, filepath.Join(r.dir, maps.PolicyMapPinName(5))); n != 1 {
		t.Errorf("bpftool shows %d entries, want 1", n)
	}

	e.write(func(w statedb.WriteTxn) { _, _, _ = e.pols.Insert(w, policyRow(5, 3, big[:10])) })
	waitFor(t, "revision 3", func() bool {
		row, ok := policyMapRow(e, 5)
		return ok && row.Realized == 3 && row.Status.Kind == reconciler.StatusDone
	}, pm)
	if n := bpftoolCount(t, filepath.Join(r.dir, maps.PolicyMapPinName(5))); n != 11 {
		t.Errorf("bpftool shows %d entries at revision 3, want 11", n)
	}
	if ids := e.polOps.Overflowing(); len(ids) != 0 {
		t.Errorf("overflowing %v after the policy fits", ids)
	}
}
