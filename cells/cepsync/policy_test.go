package cepsync_test

import (
	"encoding/json"
	"fmt"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/statedb/identity"
	statepolicy "github.com/cellium/cellium/statedb/policy"
)

// TestCEPPolicyStatus: the policy engine's row for an endpoint (here
// written by the test) shows in its CEP's .status.policy, equal to what the
// agent API shows, fills the CEP's two enforcement printer columns, and
// follows the row when it is recomputed or removed.
func TestCEPPolicyStatus(t *testing.T) {
	c, cs := setup(t, "cep-pol-node", "192.0.2.30")
	ns := c.TestNamespace(t)
	pod := createPod(t, c, ns, "web", "cep-pol-node")
	a := startAgent(t, c, "cep-pol-node", "192.0.2.30", t.TempDir())
	defer a.stop(t)
	a.policy.Paused.Store(true) // the test writes the rows
	ep := a.create(t, ns, "web", "c-web", "10.1.0.30", string(pod.UID))
	var written *statepolicy.EndpointPolicy // the row write last stored
	var writtenFor int64
	var write func(*statepolicy.EndpointPolicy)
	// cepMatches waits until the CEP's status equals the API's, and check
	// accepts its policy.
	cepMatches := func(what string, check func(*ciliumv2.EndpointPolicy) error) *ciliumv2.CiliumEndpoint {
		t.Helper()
		var out *ciliumv2.CiliumEndpoint
		eventually(t, what, func() error {
			cep, err := cs.CiliumV2().CiliumEndpoints(ns).Get(t.Context(), "web", metav1.GetOptions{})
			if err != nil {
				return err
			}
			var cur models.Endpoint
			if err := a.call("GET", fmt.Sprintf("/endpoint/%d", ep.ID), nil, &cur); err != nil {
				return err
			}
			if written != nil && cur.Status.Identity.ID != writtenFor {
				write(written)
				return fmt.Errorf("the endpoint moved to identity %d: row written again", cur.Status.Identity.ID)
			}
			want, _ := json.Marshal(cur.Status)
			have, _ := json.Marshal(cep.Status)
			if string(want) != string(have) {
				return fmt.Errorf("CEP status %s, API status %s", have, want)
			}
			out = cep
			return check(cep.Status.Policy)
		})
		return out
	}
	cepMatches("the CEP without policy", func(p *ciliumv2.EndpointPolicy) error {
		if p != nil {
			return fmt.Errorf("policy %+v before the engine wrote a row", p)
		}
		return nil
	})

	// The namespace's labels are part of the identity: if the agent saw
	// the pod before its (new) namespace, the endpoint moves to another
	// identity once it does. write stores the row for the endpoint's
	// current identity; cepMatches writes it again if the identity moved.
	write = func(p *statepolicy.EndpointPolicy) {
		var cur models.Endpoint
		if err := a.call("GET", fmt.Sprintf("/endpoint/%d", ep.ID), nil, &cur); err != nil {
			t.Fatal(err)
		}
		written, writtenFor = p, cur.Status.Identity.ID
		txn := a.db.WriteTxn(a.pols)
		if _, _, err := a.pols.Insert(txn, &statepolicy.EndpointPolicyRow{EndpointID: uint16(ep.ID), Identity: identity.NumericIdentity(writtenFor), Policy: p}); err != nil {
			t.Fatal(err)
		}
		txn.Commit()
	}
	write(&statepolicy.EndpointPolicy{Revision: 2,
		Ingress: statepolicy.DirectionPolicy{Enforcing: true, Entries: []statepolicy.Entry{
			{Key: statepolicy.NewKey(20001, statepolicy.Ingress, statepolicy.ProtoTCP, 8080, 16)},
			{Key: statepolicy.NewKey(20002, statepolicy.Ingress, statepolicy.ProtoAny, 0, 0), Deny: true},
		}},
		Egress: statepolicy.DirectionPolicy{Entries: []statepolicy.Entry{{Key: statepolicy.NewKey(0, statepolicy.Egress, 0, 0, 0)}}},
	})
	cepMatches("the CEP's policy", func(p *ciliumv2.EndpointPolicy) error {
		switch {
		case p == nil || p.Ingress == nil || p.Egress == nil:
			return fmt.Errorf("policy %+v", p)
		case !p.Ingress.Enforcing || p.Ingress.State != ciliumv2.EndpointPolicyStateEnforcing ||
			len(p.Ingress.Allowed) != 1 || p.Ingress.Allowed[0].Identity != 20001 || p.Ingress.Allowed[0].DestPort != 8080 ||
			len(p.Ingress.Denied) != 1 || p.Ingress.Denied[0].Identity != 20002:
			return fmt.Errorf("ingress %+v", p.Ingress)
		case p.Egress.Enforcing || p.Egress.State != ciliumv2.EndpointPolicyStateNonEnforcing:
			return fmt.Errorf("egress %+v", p.Egress)
		}
		return nil
	})

	// The printer columns (kubectl get cep -o wide) read .status.policy.
	var table metav1.Table
	err := cs.CiliumV2().RESTClient().Get().Namespace(ns).Resource("ciliumendpoints").Name("web").
		SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").Do(t.Context()).Into(&table)
	if err != nil {
		t.Fatal(err)
	}
	cols := map[string]any{}
	if len(table.Rows) == 1 {
		for i, col := range table.ColumnDefinitions {
			cols[col.Name] = table.Rows[0].Cells[i]
		}
	}
	if cols["Ingress Enforcement"] != "enforcing" || cols["Egress Enforcement"] != "non-enforcing" {
		t.Errorf("printer columns %v", cols)
	}

	// Recomputed: egress enforced with nothing allowed.
	write(&statepolicy.EndpointPolicy{Revision: 3,
		Ingress: statepolicy.DirectionPolicy{Entries: []statepolicy.Entry{{Key: statepolicy.NewKey(0, statepolicy.Ingress, 0, 0, 0)}}},
		Egress:  statepolicy.DirectionPolicy{Enforcing: true},
	})
	cepMatches("the recomputed policy", func(p *ciliumv2.EndpointPolicy) error {
		if p == nil || p.Egress == nil || !p.Egress.Enforcing || len(p.Egress.Allowed) != 0 || p.Ingress.Enforcing {
			return fmt.Errorf("policy %+v", p)
		}
		return nil
	})

	// The row goes (the engine dropped the endpoint): so does the policy.
	written = nil
	txn := a.db.WriteTxn(a.pols)
	if _, _, err := a.pols.Delete(txn, &statepolicy.EndpointPolicyRow{EndpointID: uint16(ep.ID)}); err != nil {
		t.Fatal(err)
	}
	txn.Commit()
	cepMatches("the policy to go", func(p *ciliumv2.EndpointPolicy) error {
		if p != nil {
			return fmt.Errorf("policy %+v", p)
		}
		return nil
	})
}
