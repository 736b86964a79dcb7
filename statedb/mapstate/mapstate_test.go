package mapstate_test

import (
	"errors"
	"testing"

	"github.com/cellium/cellium/statedb/mapstate"
	"github.com/cellium/cellium/statedb/policy"
	"github.com/cellium/cellium/statedb/reconciler"
)

// A successful reconciliation realizes the row's revision; a pending or
// failed one leaves the realized revision where it was.
func TestPolicyMapRealized(t *testing.T) {
	row := mapstate.NewPolicyMap(&policy.EndpointPolicyRow{EndpointID: 3, Policy: &policy.EndpointPolicy{Revision: 7,
		Egress: policy.DirectionPolicy{Entries: []policy.Entry{{}}}}})
	if row.Status.Kind != reconciler.StatusPending || row.Entries != 1 || row.RealizedAt(1) {
		t.Fatalf("new row: %+v", row)
	}
	failed := row.WithStatus(reconciler.Failed(errors.New("boom")))
	if failed.Realized != 0 || row.Status.Kind != reconciler.StatusPending {
		t.Errorf("failed: %+v (original %+v)", failed, row)
	}
	done := failed.WithStatus(reconciler.Done())
	if done.Realized != 7 || !done.RealizedAt(7) || !done.RealizedAt(6) || done.RealizedAt(8) {
		t.Errorf("done: %+v", done)
	}
}
