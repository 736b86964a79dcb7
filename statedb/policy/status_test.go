package policy

import (
	"reflect"
	"testing"

	"github.com/cilium/statedb"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
)

// TestEndpointStatus: the status comes from the endpoint's row, only while
// the row was computed for the endpoint's current identity.
func TestEndpointStatus(t *testing.T) {
	db := statedb.New()
	tbl, err := NewTable(db)
	if err != nil {
		t.Fatal(err)
	}
	pol := &EndpointPolicy{Revision: 7,
		Ingress: DirectionPolicy{Enforcing: true, Entries: []Entry{
			{Key: NewKey(1234, Ingress, ProtoTCP, 80, 16)},
			{Key: NewKey(5678, Ingress, 0, 0, 0), Deny: true},
		}},
		Egress: DirectionPolicy{Entries: []Entry{{Key: NewKey(0, Egress, 0, 0, 0)}}},
	}
	txn := db.WriteTxn(tbl)
	tbl.Insert(txn, &EndpointPolicyRow{EndpointID: 9, Identity: identityOf(4000), Policy: pol})
	txn.Commit()

	rtxn := db.ReadTxn()
	if got := EndpointStatus(rtxn, tbl, 10, identityOf(4000)); got != nil {
		t.Errorf("no row: got %+v, want nil", got)
	}
	if got := EndpointStatus(rtxn, tbl, 9, identityOf(4001)); got != nil {
		t.Errorf("row of an older identity: got %+v, want nil", got)
	}
	got := EndpointStatus(rtxn, tbl, 9, identityOf(4000))
	if got == nil {
		t.Fatal("no status for the endpoint's row")
	}
	in, eg := got.Ingress, got.Egress
	if !in.Enforcing || in.State != ciliumv2.EndpointPolicyStateEnforcing ||
		len(in.Allowed) != 1 || !reflect.DeepEqual(in.Allowed[0], ciliumv2.IdentityTuple{Identity: 1234, DestPort: 80, Protocol: ProtoTCP}) ||
		len(in.Denied) != 1 || in.Denied[0].Identity != 5678 {
		t.Errorf("ingress = %+v", in)
	}
	if eg.Enforcing || eg.State != ciliumv2.EndpointPolicyStateNonEnforcing || len(eg.Allowed) != 1 || eg.Allowed[0].Identity != 0 || eg.Denied != nil {
		t.Errorf("egress = %+v", eg)
	}
}
