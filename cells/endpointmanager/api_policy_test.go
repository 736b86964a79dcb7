package endpointmanager_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/statedb/endpoints"
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
	e.policy.Paused.Store(true) // the test writes the rows
	var ep models.Endpoint
	req := addReq("c1", "web", "10.0.0.10")
	req.SyncBuildEndpoint = false // no policy yet: it would wait for one
	if code := e.add(t, req, &ep); code != 201 {
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

// TestEndpointStateFollowsPolicy: an endpoint's state and policy revision
// follow the policy cell's row for it. Without a row the endpoint waits
// (a create with sync-build-endpoint waits with it); once the row is
// computed it regenerates and is ready at the row's revision; a row marked
// pending makes it wait again; the next computed revision takes it through
// regenerating to ready at that revision. The API shows both revisions
// and .status.log records every step.
func TestEndpointStateFollowsPolicy(t *testing.T) {
	e := start(t, t.TempDir(), nil, func(txn statedb.WriteTxn, pods statedb.RWTable[*corev1.Pod]) {
		pods.Insert(txn, pod("web", "uid-web", map[string]string{"app": "web"}))
	})
	e.policy.Paused.Store(true) // the test writes the rows
	req := addReq("c1", "web", "10.0.0.10")
	req.SyncBuildEndpoint = false
	var ep models.Endpoint
	if code := e.add(t, req, &ep); code != 201 {
		t.Fatalf("create: %d", code)
	}
	id := uint16(ep.ID)
	ident := identity.NumericIdentity(ep.Status.Identity.ID)
	if ep.Status.State != models.EndpointStateWaitingToRegenerate {
		t.Errorf("without a policy row the endpoint is %s, want waiting-to-regenerate", ep.Status.State)
	}
	write := func(row *statepolicy.EndpointPolicyRow) {
		t.Helper()
		txn := e.db.WriteTxn(e.pols)
		if _, _, err := e.pols.Insert(txn, row); err != nil {
			t.Fatal(err)
		}
		txn.Commit()
	}
	computed := func(rev uint64) *statepolicy.EndpointPolicyRow {
		return &statepolicy.EndpointPolicyRow{EndpointID: id, Identity: ident, Policy: &statepolicy.EndpointPolicy{Revision: rev}}
	}

	write(computed(3))
	e.waitEndpoint(t, id, "ready at revision 3", func(ep *endpoints.Endpoint) bool {
		return ep.State == ciliumv2.EndpointStateReady && ep.PolicyRevision == 3
	})
	var got models.Endpoint
	if code := e.do(t, "GET", fmt.Sprintf("/endpoint/%d", id), nil, &got); code != 200 {
		t.Fatalf("GET: %d", code)
	}
	if got.Policy == nil || got.Policy.Realized.PolicyRevision != 3 || got.Policy.Spec.PolicyRevision != 3 {
		t.Errorf("API policy revisions = %+v, want realized 3, spec 3", got.Policy)
	}

	// The policy cell marks the row: a change at revision 4 affects it.
	write(computed(3).WithPending(4))
	e.waitEndpoint(t, id, "waiting-to-regenerate", func(ep *endpoints.Endpoint) bool {
		return ep.State == ciliumv2.EndpointStateWaitingToRegenerate && ep.PolicyRevision == 3
	})
	write(computed(4))
	cur := e.waitEndpoint(t, id, "ready at revision 4", func(ep *endpoints.Endpoint) bool {
		return ep.State == ciliumv2.EndpointStateReady && ep.PolicyRevision == 4
	})
	var states []string
	for _, l := range cur.Log {
		states = append(states, l.State)
	}
	want := []string{"waiting-to-regenerate", "regenerating", "ready"}
	if len(states) < 3 || !slices.Equal(states[len(states)-3:], want) {
		t.Errorf("log states %v, want them to end with %v", states, want)
	}

	// A create that waits (the CNI plugin's) returns once the endpoint is
	// ready: the stand-in policy cell computes its row.
	e.policy.Rev.Store(4)
	e.policy.Paused.Store(false)
	var other models.Endpoint
	if code := e.add(t, addReq("c2", "web-2", "10.0.0.11"), &other); code != 201 || other.Status.State != models.EndpointStateReady ||
		other.Policy == nil || other.Policy.Realized.PolicyRevision != 4 {
		t.Errorf("create with sync-build-endpoint: %d, %s, %+v; want 201, ready at revision 4", code, other.Status.State, other.Policy)
	}
}

// waitEndpoint waits, on the table's watch channel, until endpoint id
// satisfies cond, and returns it.
func (e *env) waitEndpoint(t *testing.T, id uint16, what string, cond func(*endpoints.Endpoint) bool) *endpoints.Endpoint {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		ep, _, watch, ok := e.eps.GetWatch(e.db.ReadTxn(), endpoints.IDIndex.Query(id))
		if ok && cond(ep) {
			return ep
		}
		select {
		case <-watch:
		case <-timeout:
			t.Fatalf("timed out waiting for endpoint %d %s: %+v", id, what, ep)
		}
	}
}
