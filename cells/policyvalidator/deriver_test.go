package policyvalidator

import (
	"testing"

	"github.com/cilium/statedb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	api "github.com/cellium/cellium/api/policy"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/tables"
)

// TestDeriverSleepsWhenIdle: a step returns only channels that are still
// open once every change is consumed, before and after the tables are
// initialized, and wakes on the next change. The loop used to wait on the
// tables' initialization channels after they had closed, which spun a
// core of the operator for good (make bench-endpoints: 330 ms of operator
// CPU per pod).
func TestDeriverSleepsWhenIdle(t *testing.T) {
	db := statedb.New()
	cnps, err := k8stables.NewCNPsTable(db)
	if err != nil {
		t.Fatal(err)
	}
	ccnps, err := k8stables.NewCCNPsTable(db)
	if err != nil {
		t.Fatal(err)
	}
	desired, err := NewTable(db)
	if err != nil {
		t.Fatal(err)
	}
	txn := db.WriteTxn(cnps, ccnps, desired)
	cnpsDone := cnps.RegisterInitializer(txn, "test")
	ccnpsDone := ccnps.RegisterInitializer(txn, "test")
	initDone := desired.RegisterInitializer(txn, "policies")
	txn.Commit()

	d := &deriver{p: params{DB: db, Desired: desired, CNPs: cnps, CCNPs: ccnps}, init: tables.NewInitGate(initDone)}
	if err := d.subscribe(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.cnps.Close(); d.ccnps.Close() })

	// idle steps until no change is pending and checks that none of the
	// returned channels is closed.
	idle := func(what string) [3]<-chan struct{} {
		t.Helper()
		var w [3]<-chan struct{}
		for range 10 {
			var err error
			if w, err = d.step(); err != nil {
				t.Fatalf("%s: step: %v", what, err)
			}
			if !anyClosed(w) {
				return w
			}
		}
		t.Fatalf("%s: a step still returns a closed channel after 10 steps: the loop would spin", what)
		return w
	}

	w := idle("tables not initialized")
	txn = db.WriteTxn(cnps, ccnps)
	cnpsDone(txn)
	ccnpsDone(txn)
	txn.Commit()
	if !anyClosed(w) {
		t.Fatal("initializing the tables does not wake the deriver")
	}
	w = idle("tables initialized")
	if init, _ := desired.Initialized(db.ReadTxn()); !init {
		t.Fatal("the desired table is not initialized after its inputs are")
	}

	txn = db.WriteTxn(cnps)
	cnp := &ciliumv2.CiliumNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "a", UID: "u-p"},
		Spec: &api.Rule{EndpointSelector: &api.EndpointSelector{MatchLabels: map[string]string{"app": "web"}}}}
	if _, _, err := cnps.Insert(txn, cnp); err != nil {
		t.Fatal(err)
	}
	txn.Commit()
	if !anyClosed(w) {
		t.Fatal("a new CNP does not wake the deriver")
	}
	idle("after a change")
	if n := desired.NumObjects(db.ReadTxn()); n != 1 {
		t.Fatalf("%d desired rows, want 1", n)
	}
}

func anyClosed(ws [3]<-chan struct{}) bool {
	for _, w := range ws {
		if w == nil {
			continue
		}
		select {
		case <-w:
			return true
		default:
		}
	}
	return false
}
