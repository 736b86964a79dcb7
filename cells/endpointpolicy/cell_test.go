package endpointpolicy

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/cilium/statedb"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	api "github.com/cellium/cellium/api/policy"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/k8s/k8stest"
	"github.com/cellium/cellium/cells/policy"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/identity"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/labels"
	statepolicy "github.com/cellium/cellium/statedb/policy"
)

// tableCell provides a table both writable (for the test) and read-only
// (for the cell).
func tableCell[T any](newT func(*statedb.DB) (statedb.RWTable[T], error)) hive.Cell {
	return hive.Group(hive.Provide(newT), hive.Provide(statedb.RWTable[T].ToTable))
}

type cellFixture struct {
	db    *statedb.DB
	nps   statedb.RWTable[*networkingv1.NetworkPolicy]
	ids   statedb.RWTable[*ciliumv2.CiliumIdentity]
	eps   statedb.RWTable[*endpoints.Endpoint]
	rows  statedb.Table[*statepolicy.EndpointPolicyRow]
	cidrs statedb.Table[*statepolicy.CIDRIdentity]
	cnps  statedb.RWTable[*ciliumv2.CiliumNetworkPolicy]
	epLbl map[uint16]labels.Labels
}

func startCell(t *testing.T, args ...string) *cellFixture {
	f := &cellFixture{epLbl: map[uint16]labels.Labels{}}
	hivetest.Start(t, args,
		tableCell(k8stables.NewNetworkPoliciesTable),
		tableCell(k8stables.NewCNPsTable),
		tableCell(k8stables.NewCCNPsTable),
		tableCell(k8stables.NewCiliumIdentitiesTable),
		tableCell(k8stables.NewPodsTable),
		tableCell(endpoints.NewTable),
		Cell,
		hivetest.Capture(&f.db), hivetest.Capture(&f.nps), hivetest.Capture(&f.ids),
		hivetest.Capture(&f.eps), hivetest.Capture(&f.rows), hivetest.Capture(&f.cidrs), hivetest.Capture(&f.cnps),
	)
	return f
}

func (f *cellFixture) endpoint(t *testing.T, epID uint16, id identity.NumericIdentity, ns string, podLabels map[string]string) {
	t.Helper()
	all := labels.FromK8sPod(podLabels, ns, map[string]string{"kubernetes.io/metadata.name": ns}, "", "")
	lbls, _ := labels.DefaultFilter().Split(all)
	txn := f.db.WriteTxn(f.ids, f.eps)
	_, _, _ = f.ids.Insert(txn, &ciliumv2.CiliumIdentity{ObjectMeta: metav1.ObjectMeta{Name: id.StringID()}, SecurityLabels: lbls.Map()})
	_, _, _ = f.eps.Insert(txn, &endpoints.Endpoint{ID: epID, Identity: id, Labels: lbls, PodNamespace: ns, PodName: fmt.Sprint("pod", epID)})
	txn.Commit()
}

// waitPolicy waits until endpoint epID's row satisfies cond.
func (f *cellFixture) waitPolicy(t *testing.T, what string, epID uint16, cond func(*statepolicy.EndpointPolicyRow) error) {
	t.Helper()
	k8stest.Eventually(t, what, func() error {
		row, _, ok := f.rows.Get(f.db.ReadTxn(), statepolicy.EndpointIDIndex.Query(epID))
		if !ok {
			return fmt.Errorf("no row for endpoint %d", epID)
		}
		return cond(row)
	})
}

func TestCellComputesFromTables(t *testing.T) {
	f := startCell(t)
	f.endpoint(t, 1, 1000, "a", map[string]string{"app": "web"})
	f.endpoint(t, 2, 1001, "a", map[string]string{"app": "cli"})
	f.waitPolicy(t, "a non-enforcing policy for endpoint 1", 1, func(r *statepolicy.EndpointPolicyRow) error {
		if r.Policy.Ingress.Enforcing {
			return fmt.Errorf("ingress enforcing before any policy")
		}
		return nil
	})

	port := intstr.FromInt32(80)
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "a"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "cli"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: &port}},
			}},
		},
	}
	txn := f.db.WriteTxn(f.nps)
	_, _, _ = f.nps.Insert(txn, np)
	txn.Commit()
	want := statepolicy.NewKey(1001, statepolicy.Ingress, statepolicy.ProtoTCP, 80, 16)
	f.waitPolicy(t, "endpoint 1 to allow 1001 on tcp/80 only", 1, func(r *statepolicy.EndpointPolicyRow) error {
		if !r.Policy.Ingress.Enforcing || len(r.Policy.Ingress.Entries) != 1 || r.Policy.Ingress.Entries[0].Key != want {
			return fmt.Errorf("policy:\n%s", r.Policy.Format())
		}
		if r.Policy.Ingress.Entries[0].DerivedFrom[0] != "NetworkPolicy/a/web" {
			return fmt.Errorf("derived from %v", r.Policy.Ingress.Entries[0].DerivedFrom)
		}
		return nil
	})
	// Endpoint 2 is not selected: its row is unchanged.
	row2, _, _ := f.rows.Get(f.db.ReadTxn(), statepolicy.EndpointIDIndex.Query(2))
	if row2.Policy.Ingress.Enforcing {
		t.Error("endpoint 2 became enforcing")
	}

	// A new identity that the peer selector selects is added to the policy.
	f.endpoint(t, 3, 1002, "a", map[string]string{"app": "cli", "v": "2"})
	f.waitPolicy(t, "endpoint 1 to allow the new identity 1002", 1, func(r *statepolicy.EndpointPolicyRow) error {
		if _, ok := r.Policy.Ingress.Get(statepolicy.NewKey(1002, statepolicy.Ingress, statepolicy.ProtoTCP, 80, 16)); !ok {
			return fmt.Errorf("policy:\n%s", r.Policy.Format())
		}
		return nil
	})

	// A CNP with a CIDR rule: its prefixes get local identities in the
	// CIDR table, and endpoint 1's egress names them.
	cnp := &ciliumv2.CiliumNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "out", Namespace: "a"},
		Spec: &api.Rule{EndpointSelector: &api.EndpointSelector{MatchLabels: map[string]string{"app": "web"}},
			Egress: []api.EgressRule{{EgressCommonRule: api.EgressCommonRule{
				ToCIDRSet: api.CIDRRuleSlice{{Cidr: "10.0.0.0/8", ExceptCIDRs: []api.CIDR{"10.1.0.0/16"}}}}}}}}
	txn = f.db.WriteTxn(f.cnps)
	_, _, _ = f.cnps.Insert(txn, cnp)
	txn.Commit()
	var cidrID identity.NumericIdentity
	k8stest.Eventually(t, "the CIDR identities", func() error {
		rtxn := f.db.ReadTxn()
		a, _, okA := f.cidrs.Get(rtxn, statepolicy.CIDRPrefixIndex.Query(netip.MustParsePrefix("10.0.0.0/8")))
		b, _, okB := f.cidrs.Get(rtxn, statepolicy.CIDRPrefixIndex.Query(netip.MustParsePrefix("10.1.0.0/16")))
		if !okA || !okB || !a.Identity.HasLocalScope() || !b.Identity.HasLocalScope() || a.Identity == b.Identity {
			return fmt.Errorf("rows %v %v", a, b)
		}
		cidrID = a.Identity
		return nil
	})
	f.waitPolicy(t, "endpoint 1 to allow egress to the CIDR identity", 1, func(r *statepolicy.EndpointPolicyRow) error {
		if _, ok := r.Policy.Egress.Get(statepolicy.NewKey(cidrID, statepolicy.Egress, 0, 0, 0)); !ok || len(r.Policy.Egress.Entries) != 1 {
			return fmt.Errorf("policy:\n%s", r.Policy.Format())
		}
		return nil
	})
	txn = f.db.WriteTxn(f.cnps)
	_, _, _ = f.cnps.Delete(txn, cnp)
	txn.Commit()
	k8stest.Eventually(t, "the CIDR identities to go", func() error {
		if n := f.cidrs.NumObjects(f.db.ReadTxn()); n != 0 {
			return fmt.Errorf("%d rows left", n)
		}
		return nil
	})

	// Deleting the policy returns endpoint 1 to allow-all.
	txn = f.db.WriteTxn(f.nps)
	_, _, _ = f.nps.Delete(txn, np)
	txn.Commit()
	f.waitPolicy(t, "endpoint 1 back to non-enforcing", 1, func(r *statepolicy.EndpointPolicyRow) error {
		if r.Policy.Ingress.Enforcing {
			return fmt.Errorf("policy:\n%s", r.Policy.Format())
		}
		return nil
	})

	// Deleting the endpoint deletes its row.
	txn = f.db.WriteTxn(f.eps)
	ep, _, _ := f.eps.Get(txn, endpoints.IDIndex.Query(1))
	_, _, _ = f.eps.Delete(txn, ep)
	txn.Commit()
	k8stest.Eventually(t, "the row of endpoint 1 to go", func() error {
		if _, _, ok := f.rows.Get(f.db.ReadTxn(), statepolicy.EndpointIDIndex.Query(1)); ok {
			return fmt.Errorf("still there")
		}
		return nil
	})
}

func TestCellConfig(t *testing.T) {
	h := hivetest.New(t, []string{"--enable-policy=sometimes"},
		tableCell(k8stables.NewNetworkPoliciesTable), tableCell(k8stables.NewCNPsTable),
		tableCell(k8stables.NewCCNPsTable), tableCell(k8stables.NewCiliumIdentitiesTable),
		tableCell(k8stables.NewPodsTable), tableCell(endpoints.NewTable), Cell)
	if err := h.Start(t.Context()); err == nil {
		_ = h.Stop(t.Context())
		t.Fatal("the hive started with --enable-policy=sometimes")
	} else if !strings.Contains(err.Error(), "--enable-policy") {
		t.Errorf("error %v does not name the flag", err)
	}
}

// TestCellRejectsInvalidCNPAndKeepsPrevious: a CNP edited into an invalid
// one (a new generation) is rejected whole, as in Cilium: its previous
// rules stay in force; a later valid policy shows the cell moved past the
// edit. A status-only update (same generation) bumps no revision.
func TestCellRejectsInvalidCNPAndKeepsPrevious(t *testing.T) {
	f := startCell(t)
	f.endpoint(t, 1, 1000, "a", map[string]string{"app": "web"})
	f.endpoint(t, 2, 1001, "a", map[string]string{"app": "cli"})
	web := &api.EndpointSelector{MatchLabels: map[string]string{"app": "web"}}
	fromCli := func(port string, endPort int32) []api.IngressRule {
		return []api.IngressRule{{
			IngressCommonRule: api.IngressCommonRule{FromEndpoints: []api.EndpointSelector{{MatchLabels: map[string]string{"app": "cli"}}}},
			ToPorts:           api.PortRules{{Ports: []api.PortProtocol{{Port: port, EndPort: endPort, Protocol: api.ProtoTCP}}}},
		}}
	}
	put := func(name string, gen int64, rules ...*api.Rule) {
		t.Helper()
		cnp := &ciliumv2.CiliumNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "a", UID: types.UID("u-" + name), Generation: gen}, Specs: rules}
		txn := f.db.WriteTxn(f.cnps)
		_, _, _ = f.cnps.Insert(txn, cnp)
		txn.Commit()
	}
	has := func(port uint16) func(r *statepolicy.EndpointPolicyRow) bool {
		return func(r *statepolicy.EndpointPolicyRow) bool {
			_, ok := r.Policy.Ingress.Get(statepolicy.NewKey(1001, statepolicy.Ingress, statepolicy.ProtoTCP, port, 16))
			return ok
		}
	}
	put("p", 1, &api.Rule{EndpointSelector: web, Ingress: fromCli("80", 0)})
	var rev uint64
	f.waitPolicy(t, "endpoint 1 to allow tcp/80", 1, func(r *statepolicy.EndpointPolicyRow) error {
		if !has(80)(r) || r.PendingRevision != 0 {
			return fmt.Errorf("policy (pending %d):\n%s", r.PendingRevision, r.Policy.Format())
		}
		rev = r.Policy.Revision
		return nil
	})

	// Generation 2: a valid rule for 443 and an invalid one.
	put("p", 2, &api.Rule{EndpointSelector: web, Ingress: fromCli("443", 0)}, &api.Rule{EndpointSelector: web, Ingress: fromCli("90", 80)})
	// Same generation again (a status update): nothing to parse.
	put("p", 2, &api.Rule{EndpointSelector: web, Ingress: fromCli("443", 0)}, &api.Rule{EndpointSelector: web, Ingress: fromCli("90", 80)})
	put("later", 1, &api.Rule{EndpointSelector: web, Ingress: fromCli("8080", 0)})
	f.waitPolicy(t, "the later policy applied, p's first version kept, its invalid edit not", 1, func(r *statepolicy.EndpointPolicyRow) error {
		switch {
		case !has(8080)(r):
			return fmt.Errorf("later not applied yet:\n%s", r.Policy.Format())
		case !has(80)(r) || has(443)(r):
			return fmt.Errorf("p's previous rules not kept, or its invalid edit applied:\n%s", r.Policy.Format())
		case r.Policy.Revision != rev+1 || r.PendingRevision != 0:
			return fmt.Errorf("revision %d (pending %d), want %d: only the later policy changes the repository", r.Policy.Revision, r.PendingRevision, rev+1)
		}
		return nil
	})
}

// TestMarkPending: the first commit of a round marks the rows of affected
// endpoints whose policy is older than the repository; the computation
// clears the mark and carries the new revision.
func TestMarkPending(t *testing.T) {
	db := statedb.New()
	rows, err := statepolicy.NewTable(db)
	if err != nil {
		t.Fatal(err)
	}
	e := policy.NewEngine(policy.ModeDefault)
	c := &controller{p: controllerParams{DB: db, Engine: e, Policies: rows}}
	ep := &endpoints.Endpoint{ID: 1, Identity: 1000}
	txn := db.WriteTxn(rows)
	_, _, _ = rows.Insert(txn, &statepolicy.EndpointPolicyRow{EndpointID: 1, Identity: 1000, Policy: &statepolicy.EndpointPolicy{Revision: e.Revision()}})
	_, _, _ = rows.Insert(txn, &statepolicy.EndpointPolicyRow{EndpointID: 2, Identity: 999, Policy: &statepolicy.EndpointPolicy{Revision: e.Revision()}})
	txn.Commit()
	c.markPending([]*endpoints.Endpoint{ep})
	if r, _, _ := rows.Get(db.ReadTxn(), statepolicy.EndpointIDIndex.Query(1)); r.PendingRevision != 0 {
		t.Errorf("marked without a repository change: %+v", r)
	}
	e.UpsertRules(policy.Source{Kind: policy.KindCNP, Namespace: "a", Name: "x"}, nil) // bumps the revision
	c.markPending([]*endpoints.Endpoint{ep, {ID: 2, Identity: 1001}})
	r, _, _ := rows.Get(db.ReadTxn(), statepolicy.EndpointIDIndex.Query(1))
	if r.PendingRevision != e.Revision() || r.Computed(1000) {
		t.Errorf("row after a change: %+v, want pending at %d", r, e.Revision())
	}
	if r2, _, _ := rows.Get(db.ReadTxn(), statepolicy.EndpointIDIndex.Query(2)); r2.PendingRevision != 0 {
		t.Errorf("row of another identity marked: %+v", r2)
	}
}

// TestCellStampsSeen: a row written for a policy change carries when the
// cell took the change, after the write into the CNP table and before the
// row is there (the bench measures from it).
func TestCellStampsSeen(t *testing.T) {
	f := startCell(t)
	f.endpoint(t, 1, 1000, "a", map[string]string{"app": "web"})
	f.waitPolicy(t, "a row for endpoint 1", 1, func(r *statepolicy.EndpointPolicyRow) error {
		if r.Seen.IsZero() {
			return fmt.Errorf("no seen time in %+v", r)
		}
		return nil
	})
	cnp := &ciliumv2.CiliumNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "in", Namespace: "a"},
		Spec: &api.Rule{EndpointSelector: &api.EndpointSelector{MatchLabels: map[string]string{"app": "web"}},
			Ingress: []api.IngressRule{{IngressCommonRule: api.IngressCommonRule{
				FromEndpoints: []api.EndpointSelector{{MatchLabels: map[string]string{"app": "cli"}}}}}}}}
	before := time.Now()
	txn := f.db.WriteTxn(f.cnps)
	_, _, _ = f.cnps.Insert(txn, cnp)
	txn.Commit()
	var seen time.Time
	f.waitPolicy(t, "endpoint 1 enforcing ingress", 1, func(r *statepolicy.EndpointPolicyRow) error {
		if !r.Policy.Ingress.Enforcing {
			return fmt.Errorf("policy:\n%s", r.Policy.Format())
		}
		seen = r.Seen
		return nil
	})
	if after := time.Now(); seen.Before(before) || seen.After(after) {
		t.Errorf("seen %s, want between the write %s and the row %s", seen, before, after)
	}
}
