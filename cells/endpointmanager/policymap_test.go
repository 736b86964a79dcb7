package endpointmanager_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/cilium/statedb"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/mapstate"
	statepolicy "github.com/cellium/cellium/statedb/policy"
	"github.com/cellium/cellium/statedb/reconciler"
)

// fakePolicyMaps plays the policy map reconciler: for every policy row it
// writes the policy-maps row, reconciled (Done) unless its revision is in
// tooLarge, which fails as an overflowing map does.
type fakePolicyMaps struct {
	mu       sync.Mutex
	tooLarge map[uint64]bool
}

const overflowError = "20000 entries do not fit the map (at most 16384): it holds the policy's 0 deny entries alone and the endpoint drops all traffic until its policy fits: policy larger than the policy map"

func (f *fakePolicyMaps) setTooLarge(rev uint64, on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tooLarge[rev] = on
}

func (f *fakePolicyMaps) cell() hive.Cell {
	return hive.Module("fake-policy-maps", "Stands in for the policy map reconciler",
		hive.Provide(mapstate.NewPoliciesTable, statedb.RWTable[*mapstate.PolicyMap].ToTable),
		hive.Invoke(func(db *statedb.DB, pols statedb.Table[*statepolicy.EndpointPolicyRow], rows statedb.RWTable[*mapstate.PolicyMap], jobs hive.Jobs) {
			jobs.Add(hive.ObserveTable("fake-policy-maps", db, pols, func(_ context.Context, c statedb.Change[*statepolicy.EndpointPolicyRow]) error {
				if c.Deleted || c.Object.Policy == nil {
					return nil
				}
				f.mu.Lock()
				fail := f.tooLarge[c.Object.Policy.Revision]
				f.mu.Unlock()
				txn := db.WriteTxn(rows)
				row, _, ok := rows.Get(txn, mapstate.PolicyEndpointIndex.Query(c.Object.EndpointID))
				next := mapstate.NewPolicyMap(c.Object)
				if ok {
					next.Realized = row.Realized
				}
				st := reconciler.Done()
				if fail {
					st = reconciler.Failed(fmt.Errorf("policy map of endpoint %d (revision %d): %s", c.Object.EndpointID, c.Object.Policy.Revision, overflowError))
				}
				if _, _, err := rows.Insert(txn, next.WithStatus(st)); err != nil {
					txn.Abort()
					return err
				}
				txn.Commit()
				return nil
			}))
		}),
	)
}

// An endpoint whose policy map overflows (the map fails closed and drops
// everything) is not-ready, with the reconciler's error in its log and the
// CEP's health Failure; a CNI ADD in that state fails at once with the
// error; a revision that fits makes the endpoint ready again.
func TestNotReadyWhenPolicyMapOverflows(t *testing.T) {
	maps := &fakePolicyMaps{tooLarge: map[uint64]bool{}}
	reg := prometheus.NewPedanticRegistry()
	e := startWith(t, t.TempDir(), nil, func(txn statedb.WriteTxn, pods statedb.RWTable[*corev1.Pod]) {
		pods.Insert(txn, pod("web-1", "uid-1", map[string]string{"app": "web"}))
		pods.Insert(txn, pod("big", "uid-2", map[string]string{"app": "big"}))
	}, nil, maps.cell(), hive.Provide(func() prometheus.Registerer { return reg }))
	var web models.Endpoint
	if code := e.add(t, addReq("c1", "web-1", "10.0.0.10"), &web); code != 201 || web.Status.State != models.EndpointStateReady {
		t.Fatalf("ADD web-1: %d %s", code, web.Status.State)
	}

	// Revision 2 does not fit web-1's map.
	maps.setTooLarge(2, true)
	id := uint16(web.ID)
	cur, _, _ := e.eps.Get(e.db.ReadTxn(), endpoints.IDIndex.Query(id))
	txn := e.db.WriteTxn(e.pols)
	_, _, _ = e.pols.Insert(txn, &statepolicy.EndpointPolicyRow{EndpointID: id, Identity: cur.Identity, Policy: &statepolicy.EndpointPolicy{Revision: 2}})
	txn.Commit()
	ep := waitEndpoint(t, e, id, "not-ready", func(ep *endpoints.Endpoint) bool { return ep.State == ciliumv2.EndpointStateNotReady })
	st := ep.Status("")
	if last := st.Log[len(st.Log)-1].Message; !strings.Contains(last, "policy larger than the policy map") || !strings.Contains(last, "revision 2") {
		t.Errorf("last log entry %q does not say why", last)
	}
	if st.Health.OverallHealth != ciliumv2.EndpointHealthFailure {
		t.Errorf("CEP health %s, want Failure", st.Health.OverallHealth)
	}
	var got models.Endpoint
	e.do(t, "GET", fmt.Sprintf("/endpoint/%d", id), nil, &got)
	if got.Status.State != models.EndpointStateNotReady {
		t.Errorf("API state %s, want not-ready", got.Status.State)
	}
	if n := endpointStateMetric(t, reg, "not-ready"); n != 1 {
		t.Errorf(`cellium_endpoint_state{endpoint_state="not-ready"} = %v, want 1`, n)
	}

	// A new pod whose policy (revision 2) does not fit: its ADD fails
	// at once with the reason.
	e.policy.Rev.Store(2)
	var apiErr models.Error
	if code := e.add(t, addReq("c2", "big", "10.0.0.11"), &apiErr); code != 503 || !strings.Contains(apiErr.Message, "policy larger than the policy map") {
		t.Errorf("ADD of a pod whose policy overflows: %d %q, want 503 with the reason", code, apiErr.Message)
	}

	// Revision 3 fits: ready again.
	maps.setTooLarge(3, false)
	txn = e.db.WriteTxn(e.pols)
	_, _, _ = e.pols.Insert(txn, &statepolicy.EndpointPolicyRow{EndpointID: id, Identity: cur.Identity, Policy: &statepolicy.EndpointPolicy{Revision: 3}})
	txn.Commit()
	ep = waitEndpoint(t, e, id, "ready again", func(ep *endpoints.Endpoint) bool {
		return ep.State == ciliumv2.EndpointStateReady && ep.PolicyRevision == 3
	})
	if ep.Status("").Health.OverallHealth != ciliumv2.EndpointHealthOK {
		t.Errorf("health after recovery: %s", ep.Status("").Health.OverallHealth)
	}
	if n := endpointStateMetric(t, reg, "not-ready"); n != 0 {
		t.Errorf(`cellium_endpoint_state{endpoint_state="not-ready"} = %v after recovery, want 0`, n)
	}
}

// endpointStateMetric is cellium_endpoint_state for state (0: no series).
func endpointStateMetric(t *testing.T, reg prometheus.Gatherer, state string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "cellium_endpoint_state" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == state {
				return m.GetGauge().GetValue()
			}
		}
	}
	return 0
}
