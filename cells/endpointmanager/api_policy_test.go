package endpointmanager_test

import (
	"fmt"
	"testing"

	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"

	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/statedb/identity"
	statepolicy "github.com/cellium/cellium/statedb/policy"
)

// TestAPIEndpointPolicyStatus: GET /v1/endpoint/{id} shows in .status.policy
// the row the policy engine wrote for the endpoint (per direction enforcing,
// state, allowed and denied tuples), follows the row when it changes, and
// shows nothing for a row computed for another identity or no row at all.
func TestAPIEndpointPolicyStatus(t *testing.T) {
	e := start(t, t.TempDir(), nil, func(txn statedb.WriteTxn, pods statedb.RWTable[*corev1.Pod]) {
		pods.Insert(txn, pod("web", "uid-web", map[string]string{"app": "web"}))
	})
	var ep models.Endpoint
	if code := e.add(t, addReq("c1", "web", "10.0.0.10"), &ep); code != 201 {
		t.Fatalf("create: %d", code)
	}
	if ep.Status.Policy != nil {
		t.Errorf("no policy row yet, .status.policy = %+v", ep.Status.Policy)
	}
	ident := identity.NumericIdentity(ep.Status.Identity.ID)
	get := func() *models.EndpointPolicy {
		t.Helper()
		var got models.Endpoint
		if code := e.do(t, "GET", fmt.Sprintf("/endpoint/%d", ep.ID), nil, &got); code != 200 {
			t.Fatalf("GET endpoint: %d", code)
		}
		return got.Status.Policy
	}
	write := func(id identity.NumericIdentity, p *statepolicy.EndpointPolicy) {
		txn := e.db.WriteTxn(e.pols)
		if _, _, err := e.pols.Insert(txn, &statepolicy.EndpointPolicyRow{EndpointID: uint16(ep.ID), Identity: id, Policy: p}); err != nil {
			t.Fatal(err)
		}
		txn.Commit()
	}

	write(ident, &statepolicy.EndpointPolicy{Revision: 3,
		Ingress: statepolicy.DirectionPolicy{Enforcing: true, Entries: []statepolicy.Entry{
			{Key: statepolicy.NewKey(1234, statepolicy.Ingress, statepolicy.ProtoTCP, 80, 16), DerivedFrom: []string{"NetworkPolicy/default/web"}},
			{Key: statepolicy.NewKey(5678, statepolicy.Ingress, statepolicy.ProtoAny, 0, 0), Deny: true},
		}},
		Egress: statepolicy.DirectionPolicy{Entries: []statepolicy.Entry{{Key: statepolicy.NewKey(0, statepolicy.Egress, 0, 0, 0)}}},
	})
	p := get()
	if p == nil || p.Ingress == nil || p.Egress == nil {
		t.Fatalf(".status.policy = %+v, want both directions", p)
	}
	if !p.Ingress.Enforcing || p.Ingress.State != "enforcing" ||
		len(p.Ingress.Allowed) != 1 || p.Ingress.Allowed[0].Identity != 1234 || p.Ingress.Allowed[0].DestPort != 80 || p.Ingress.Allowed[0].Protocol != 6 ||
		len(p.Ingress.Denied) != 1 || p.Ingress.Denied[0].Identity != 5678 {
		t.Errorf("ingress = %+v", p.Ingress)
	}
	if p.Egress.Enforcing || p.Egress.State != "non-enforcing" || len(p.Egress.Allowed) != 1 || p.Egress.Allowed[0].Identity != 0 {
		t.Errorf("egress = %+v", p.Egress)
	}

	// The engine recomputes: egress now enforced with nothing allowed.
	write(ident, &statepolicy.EndpointPolicy{Revision: 4,
		Ingress: statepolicy.DirectionPolicy{Entries: []statepolicy.Entry{{Key: statepolicy.NewKey(0, statepolicy.Ingress, 0, 0, 0)}}},
		Egress:  statepolicy.DirectionPolicy{Enforcing: true},
	})
	if p := get(); p == nil || !p.Egress.Enforcing || len(p.Egress.Allowed) != 0 || p.Ingress.Enforcing {
		t.Errorf("after recomputation .status.policy = %+v", p)
	}

	// A row for an identity the endpoint no longer has is not shown.
	write(ident+1, &statepolicy.EndpointPolicy{Egress: statepolicy.DirectionPolicy{Enforcing: true}})
	if p := get(); p != nil {
		t.Errorf("row of another identity shown: %+v", p)
	}
}
