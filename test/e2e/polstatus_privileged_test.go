package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	api "github.com/cellium/cellium/api/policy"
	"github.com/cellium/cellium/api/v1/models"
)

// TestPrivilegedPolicyStatusAndRegeneration, against the real API server
// with the operator and the agent:
//   - a valid CNP gets Valid=True and Supported=True from the operator, and
//     the endpoint it selects regenerates: its log shows it regenerating
//     for the new policy revision, it ends ready with that revision
//     realized (equal to the computed one, and not above the repository's);
//   - a CNP with an invalid field gets Valid=False naming the field, is
//     not imported by the agent (`cellium policy get` lists it as rejected,
//     naming the field, and not among the rules), and leaves
//     the valid CNP and the endpoint's policy as they were;
//   - a CNP with HTTP rules gets Valid=True and Supported=False with reason
//     L7RulesNotEnforced naming rules.http, and `cellium policy get` says
//     the L7 rules are not enforced.
func TestPrivilegedPolicyStatusAndRegeneration(t *testing.T) {
	e := newEnv(t, envOptions{})
	cli := cliBinary(t)
	e.createPods(map[string]map[string]string{"web": {"app": "web"}})
	ceps := e.waitCEPs(e.waitRunning([]string{"web"}, 90*time.Second), 60*time.Second)
	epID := fmt.Sprint(ceps["web"].Status.ID)
	before, err := e.agent.GetEndpoint(e.ctx, epID)
	if err != nil {
		t.Fatal(err)
	}
	if before.Policy == nil || before.Status.State != models.EndpointStateReady {
		t.Fatalf("web before any policy: %s, revisions %+v; want ready with revisions", before.Status.State, before.Policy)
	}
	rev0 := before.Policy.Realized.PolicyRevision

	webSel := &api.EndpointSelector{MatchLabels: map[string]string{"app": "web"}}
	ingressOn := func(ports ...api.PortProtocol) []api.IngressRule {
		return []api.IngressRule{{
			IngressCommonRule: api.IngressCommonRule{FromEndpoints: []api.EndpointSelector{{MatchLabels: map[string]string{"app": "client"}}}},
			ToPorts:           api.PortRules{{Ports: ports}},
		}}
	}
	create := func(name string, spec *api.Rule) {
		t.Helper()
		cnp := &ciliumv2.CiliumNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns}, Spec: spec}
		if _, err := e.cilium.CiliumV2().CiliumNetworkPolicies(e.ns).Create(e.ctx, cnp, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create CNP %s: %v", name, err)
		}
	}
	// waitCondition waits until the CNP's condition typ has status want
	// and its message contains msg (and reason, when not empty).
	waitCondition := func(name string, typ ciliumv2.PolicyConditionType, want corev1.ConditionStatus, reason, msg string) {
		t.Helper()
		eventually(t, 60*time.Second, fmt.Sprintf("CNP %s %s=%s", name, typ, want), func() error {
			cnp, err := e.cilium.CiliumV2().CiliumNetworkPolicies(e.ns).Get(e.ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			for _, c := range cnp.Status.Conditions {
				if c.Type == typ {
					if c.Status != want || !strings.Contains(c.Message, msg) || (reason != "" && c.Reason != reason) || c.LastTransitionTime.IsZero() {
						return fmt.Errorf("condition %+v", c)
					}
					return nil
				}
			}
			return fmt.Errorf("no %s condition in %+v", typ, cnp.Status.Conditions)
		})
	}

	// A valid policy: the operator says so, and web regenerates for it.
	applied := time.Now()
	create("web-valid", &api.Rule{EndpointSelector: webSel, Ingress: ingressOn(api.PortProtocol{Port: "80", Protocol: api.ProtoTCP})})
	waitCondition("web-valid", ciliumv2.PolicyConditionValid, corev1.ConditionTrue, "", "Policy validation succeeded")
	waitCondition("web-valid", "Supported", corev1.ConditionTrue, "AllFieldsSupported", "")
	var after models.Endpoint
	eventually(t, 60*time.Second, "web to regenerate for the new policy", func() error {
		ep, err := e.agent.GetEndpoint(e.ctx, epID)
		if err != nil {
			return err
		}
		switch {
		case ep.Policy == nil || ep.Policy.Realized.PolicyRevision <= rev0:
			return fmt.Errorf("revisions %+v, want realized above %d", ep.Policy, rev0)
		case ep.Status.State != models.EndpointStateReady || ep.Policy.Spec != ep.Policy.Realized:
			return fmt.Errorf("state %s, revisions %+v", ep.Status.State, ep.Policy)
		case ep.Status.Policy == nil || ep.Status.Policy.Ingress == nil || !ep.Status.Policy.Ingress.Enforcing:
			return fmt.Errorf("ingress not enforcing: %+v", ep.Status.Policy)
		}
		after = *ep
		return nil
	})
	rev := after.Policy.Realized.PolicyRevision
	t.Logf("web regenerated from policy revision %d to %d, seen %v after the CNP was created (after its conditions); log: %s",
		rev0, rev, time.Since(applied).Round(time.Millisecond), logStates(after.Status.Log))
	regenerated := false
	for _, l := range after.Status.Log {
		if l.State == string(ciliumv2.EndpointStateRegenerating) && strings.Contains(l.Message, fmt.Sprintf("policy revision %d computed", rev)) {
			regenerated = true
		}
	}
	if !regenerated {
		t.Errorf("web's log shows no regeneration for revision %d: %+v", rev, after.Status.Log)
	}
	pi := e.policyGet(t, cli)
	if pi.Revision < rev {
		t.Errorf("repository revision %d below the endpoint's %d", pi.Revision, rev)
	}

	// An invalid field: Valid=False naming it; nothing else changes.
	create("web-invalid", &api.Rule{EndpointSelector: webSel, Ingress: ingressOn(api.PortProtocol{Port: "80", EndPort: 70, Protocol: api.ProtoTCP})})
	waitCondition("web-invalid", ciliumv2.PolicyConditionValid, corev1.ConditionFalse, "", "spec: ingress[0].toPorts[0].ports[0]: endPort 70 is below port 80")
	// A later policy shows the agent has moved past the invalid one.
	create("web-l7", &api.Rule{EndpointSelector: webSel, Ingress: []api.IngressRule{{
		IngressCommonRule: api.IngressCommonRule{FromEndpoints: []api.EndpointSelector{{MatchLabels: map[string]string{"app": "client"}}}},
		ToPorts: api.PortRules{{
			Ports: []api.PortProtocol{{Port: "8080", Protocol: api.ProtoTCP}},
			Rules: &api.L7Rules{HTTP: []api.PortRuleHTTP{{Method: "GET", Path: "/"}}},
		}},
	}}})
	waitCondition("web-l7", ciliumv2.PolicyConditionValid, corev1.ConditionTrue, "", "")
	waitCondition("web-l7", "Supported", corev1.ConditionFalse, "L7RulesNotEnforced", "spec.ingress[0].toPorts[0].rules.http")
	waitCondition("web-valid", ciliumv2.PolicyConditionValid, corev1.ConditionTrue, "", "")
	var l7Warning bool
	eventually(t, 60*time.Second, "the agent to import web-l7", func() error {
		pi = e.policyGet(t, cli)
		var names []string
		l7Warning = false
		for _, r := range pi.Rules {
			if r.Source.Namespace != e.ns {
				continue
			}
			names = append(names, r.Source.Name)
			if r.Source.Name == "web-l7" {
				l7Warning = strings.Contains(strings.Join(r.Warnings, ";"), "rules.http: L7 rules are not enforced")
			}
		}
		if strings.Join(names, ",") != "web-l7,web-valid" && strings.Join(names, ",") != "web-valid,web-l7" {
			return fmt.Errorf("rules of the namespace from %v, want web-valid and web-l7 (web-invalid rejected)", names)
		}
		return nil
	})
	rejected := false
	for _, r := range pi.Rejected {
		rejected = rejected || (r.Source.Namespace == e.ns && r.Source.Name == "web-invalid" && strings.Contains(r.Error, "ingress[0].toPorts[0].ports[0]"))
	}
	if !rejected {
		t.Errorf("policy get does not list web-invalid as rejected naming the field: %+v", pi.Rejected)
	}
	if !l7Warning {
		t.Errorf("policy get does not report web-l7's HTTP rules as not enforced: %+v", pi.Rules)
	}
	ep, err := e.agent.GetEndpoint(e.ctx, epID)
	if err != nil {
		t.Fatal(err)
	}
	if p := ep.Status.Policy; p == nil || p.Ingress == nil || !p.Ingress.Enforcing || ep.Status.State != models.EndpointStateReady {
		t.Errorf("web's ingress after the invalid policy: %+v", p)
	}
	out, err := e.policyCLI(cli, "endpoint", "list")
	if err != nil || !strings.Contains(out, "REVISION") {
		t.Errorf("endpoint list: %v\n%s", err, out)
	}
}

// policyInfo is what `cellium policy get -o json` prints.
type policyInfo struct {
	Revision uint64 `json:"revision"`
	Rules    []struct {
		Source   struct{ Kind, Namespace, Name string } `json:"source"`
		Warnings []string                               `json:"warnings"`
	} `json:"rules"`
	Rejected []struct {
		Source struct{ Kind, Namespace, Name string } `json:"source"`
		Error  string                                 `json:"error"`
	} `json:"rejected"`
}

func (e *env) policyGet(t *testing.T, cli string) policyInfo {
	t.Helper()
	out, err := e.policyCLI(cli, "policy", "get", "-o", "json")
	if err != nil {
		t.Fatalf("cellium policy get: %v\n%s", err, out)
	}
	var pi policyInfo
	if err := json.Unmarshal([]byte(out), &pi); err != nil {
		t.Fatalf("policy get -o json: %v\n%s", err, out)
	}
	return pi
}

// logStates prints an endpoint's state-change log as "state: message; ...".
func logStates(log []*models.EndpointStatusChange) string {
	var parts []string
	for _, l := range log {
		if l != nil {
			parts = append(parts, l.State+": "+l.Message)
		}
	}
	return strings.Join(parts, "; ")
}
