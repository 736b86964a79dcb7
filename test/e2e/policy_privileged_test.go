package e2e

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	api "github.com/cellium/cellium/api/policy"
)

// TestPrivilegedPolicyFromAPI: a NetworkPolicy and a CiliumNetworkPolicy
// created in the API server reach the agent, which runs with its
// ServiceAccount's least-privilege credentials, and become the computed
// policy of the pods they select: `cellium policy get` lists both rules
// with their objects; the CEPs' .status.policy (equal to the agent API's)
// enforce with the peer's identity allowed; `cellium policy trace` allows
// the selected peer on the selected port and denies the rest; relabelling
// a pod moves it into a selection; deleting the NetworkPolicy lifts the
// enforcement it caused.
func TestPrivilegedPolicyFromAPI(t *testing.T) {
	e := newEnv(t, envOptions{})
	cli := cliBinary(t)
	names := []string{"web", "client", "other"}
	e.createPods(map[string]map[string]string{
		"web": {"app": "web"}, "client": {"app": "client"}, "other": {"app": "other"},
	})
	ceps := e.waitCEPs(e.waitRunning(names, 90*time.Second), 60*time.Second)
	id := func(n string) int64 { return ceps[n].Status.Identity.ID }

	// web: ingress from app=client on TCP/80 only.
	port := intstr.FromInt32(80)
	tcp := corev1.ProtocolTCP
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "web-ingress", Namespace: e.ns},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}},
			}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
		},
	}
	if _, err := e.cs.NetworkingV1().NetworkPolicies(e.ns).Create(e.ctx, np, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// client: egress to app=web on TCP/80 only.
	cnp := &ciliumv2.CiliumNetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "client-egress", Namespace: e.ns},
		Spec: &api.Rule{
			EndpointSelector: &api.EndpointSelector{MatchLabels: map[string]string{"app": "client"}},
			Egress: []api.EgressRule{{
				EgressCommonRule: api.EgressCommonRule{ToEndpoints: []api.EndpointSelector{{MatchLabels: map[string]string{"app": "web"}}}},
				ToPorts:          api.PortRules{{Ports: []api.PortProtocol{{Port: "80", Protocol: api.ProtoTCP}}}},
			}},
		},
	}
	if _, err := e.cilium.CiliumV2().CiliumNetworkPolicies(e.ns).Create(e.ctx, cnp, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// waitPolicies waits until every CEP's .status equals the agent's view
	// of the endpoint and check accepts the CEPs' policies.
	waitPolicies := func(what string, check func(map[string]*ciliumv2.EndpointPolicy) error) {
		t.Helper()
		eventually(t, 60*time.Second, what, func() error {
			cur, err := e.ceps()
			if err != nil {
				return err
			}
			pols := map[string]*ciliumv2.EndpointPolicy{}
			for _, n := range names {
				cep := cur[n]
				if cep == nil {
					return fmt.Errorf("no CEP for %s", n)
				}
				ep, err := e.agent.GetEndpoint(e.ctx, fmt.Sprint(cep.Status.ID))
				if err != nil {
					return err
				}
				if ok, a, b := jsonEqual(ep.Status, cep.Status); !ok {
					return fmt.Errorf("pod %s: agent .status\n%s\n!= CEP .status\n%s", n, a, b)
				}
				if p := cep.Status.Policy; p == nil || p.Ingress == nil || p.Egress == nil {
					return fmt.Errorf("pod %s: .status.policy %+v", n, p)
				}
				pols[n] = cep.Status.Policy
				ceps[n] = cep
			}
			return check(pols)
		})
	}
	waitPolicies("web's ingress and client's egress to enforce", func(p map[string]*ciliumv2.EndpointPolicy) error {
		switch {
		case !p["web"].Ingress.Enforcing || !hasTuple(p["web"].Ingress.Allowed, id("client"), 80, 6) || len(p["web"].Ingress.Allowed) != 1:
			return fmt.Errorf("web ingress %+v", p["web"].Ingress)
		case p["web"].Egress.Enforcing:
			return fmt.Errorf("web egress enforcing")
		case !p["client"].Egress.Enforcing || !hasTuple(p["client"].Egress.Allowed, id("web"), 80, 6):
			return fmt.Errorf("client egress %+v", p["client"].Egress)
		case p["client"].Ingress.Enforcing, p["other"].Ingress.Enforcing, p["other"].Egress.Enforcing:
			return fmt.Errorf("client ingress or other enforcing: %+v %+v", p["client"], p["other"])
		}
		return nil
	})

	// `cellium policy get -o json` names both objects.
	out, err := e.policyCLI(cli, "policy", "get", "-o", "json")
	if err != nil {
		t.Fatalf("cellium policy get: %v\n%s", err, out)
	}
	var pi struct {
		Revision uint64 `json:"revision"`
		Rules    []struct {
			Source struct{ Kind, Namespace, Name string } `json:"source"`
		} `json:"rules"`
	}
	if err := json.Unmarshal([]byte(out), &pi); err != nil {
		t.Fatalf("policy get -o json: %v\n%s", err, out)
	}
	var sources []string
	for _, r := range pi.Rules {
		if r.Source.Namespace == e.ns {
			sources = append(sources, r.Source.Kind+"/"+r.Source.Name)
		}
	}
	slices.Sort(sources)
	if want := []string{"CiliumNetworkPolicy/client-egress", "NetworkPolicy/web-ingress"}; !slices.Equal(sources, want) || pi.Revision == 0 {
		t.Errorf("policy get: rules of the namespace %v (revision %d), want %v", sources, pi.Revision, want)
	}

	// `cellium policy trace` decides as the rules say.
	trace := func(src, dst, dport, want string) {
		t.Helper()
		out, err := e.policyCLI(cli, "policy", "trace", "--src-k8s-pod", e.ns+":"+src, "--dst-k8s-pod", e.ns+":"+dst, "--dport", dport)
		if err != nil {
			t.Fatalf("policy trace %s -> %s %s: %v\n%s", src, dst, dport, err, out)
		}
		if !strings.Contains(out, "Final verdict: "+want) {
			t.Errorf("policy trace %s -> %s %s: want %s:\n%s", src, dst, dport, want, out)
		}
	}
	trace("client", "web", "80/TCP", "ALLOWED")
	trace("client", "web", "81/TCP", "DENIED")
	trace("client", "web", "80/UDP", "DENIED")
	trace("other", "web", "80/TCP", "DENIED")
	trace("client", "other", "80/TCP", "DENIED") // client's egress
	trace("web", "other", "443/TCP", "ALLOWED")

	// Relabelling other to app=client gives it client's selections.
	patch := []byte(`{"metadata":{"labels":{"app":"client"}}}`)
	if _, err := e.cs.CoreV1().Pods(e.ns).Patch(e.ctx, "other", types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPolicies("the relabelled pod to be selected", func(p map[string]*ciliumv2.EndpointPolicy) error {
		switch {
		case id("other") != id("client"):
			return fmt.Errorf("other has identity %d, client %d", id("other"), id("client"))
		case !p["other"].Egress.Enforcing:
			return fmt.Errorf("other's egress not enforcing")
		}
		return nil
	})
	trace("other", "web", "80/TCP", "ALLOWED")

	// Deleting the NetworkPolicy lifts web's ingress enforcement.
	if err := e.cs.NetworkingV1().NetworkPolicies(e.ns).Delete(e.ctx, "web-ingress", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPolicies("web's ingress to stop enforcing", func(p map[string]*ciliumv2.EndpointPolicy) error {
		if p["web"].Ingress.Enforcing || p["web"].Ingress.State != ciliumv2.EndpointPolicyStateNonEnforcing || !p["client"].Egress.Enforcing {
			return fmt.Errorf("web %+v, client %+v", p["web"].Ingress, p["client"].Egress)
		}
		return nil
	})
	trace("client", "web", "81/TCP", "DENIED") // still client's egress

	// Editing the CNP moves client's egress from TCP/80 to TCP/8080.
	cur, err := e.cilium.CiliumV2().CiliumNetworkPolicies(e.ns).Get(e.ctx, "client-egress", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Spec.Egress[0].ToPorts[0].Ports[0].Port = "8080"
	if _, err := e.cilium.CiliumV2().CiliumNetworkPolicies(e.ns).Update(e.ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPolicies("the edited CNP to move client's egress to 8080", func(p map[string]*ciliumv2.EndpointPolicy) error {
		if !hasTuple(p["client"].Egress.Allowed, id("web"), 8080, 6) || hasTuple(p["client"].Egress.Allowed, id("web"), 80, 6) {
			return fmt.Errorf("client egress %+v", p["client"].Egress)
		}
		return nil
	})
	trace("client", "web", "8080/TCP", "ALLOWED")
	trace("client", "web", "80/TCP", "DENIED")

	// A CCNP denying web's ingress from app=client (scoped to this
	// namespace's pods) wins over everything that allows it.
	ccnp := &ciliumv2.CiliumClusterwideNetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: e.ns + "-web-deny-client"},
		Spec: &api.Rule{
			EndpointSelector: &api.EndpointSelector{MatchLabels: map[string]string{"app": "web", "k8s:io.kubernetes.pod.namespace": e.ns}},
			IngressDeny: []api.IngressDenyRule{{
				IngressCommonRule: api.IngressCommonRule{FromEndpoints: []api.EndpointSelector{{MatchLabels: map[string]string{"app": "client", "k8s:io.kubernetes.pod.namespace": e.ns}}}},
			}},
		},
	}
	if _, err := e.cilium.CiliumV2().CiliumClusterwideNetworkPolicies().Create(e.ctx, ccnp, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPolicies("the CCNP to deny web's ingress from client", func(p map[string]*ciliumv2.EndpointPolicy) error {
		if !p["web"].Ingress.Enforcing || !slices.ContainsFunc(p["web"].Ingress.Denied, func(tu ciliumv2.IdentityTuple) bool { return tu.Identity == uint64(id("client")) }) {
			return fmt.Errorf("web ingress %+v", p["web"].Ingress)
		}
		return nil
	})
	trace("client", "web", "8080/TCP", "DENIED")
	if err := e.cilium.CiliumV2().CiliumClusterwideNetworkPolicies().Delete(e.ctx, ccnp.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPolicies("the deleted CCNP to lift its deny", func(p map[string]*ciliumv2.EndpointPolicy) error {
		if p["web"].Ingress.Enforcing || len(p["web"].Ingress.Denied) != 0 {
			return fmt.Errorf("web ingress %+v", p["web"].Ingress)
		}
		return nil
	})
	trace("client", "web", "8080/TCP", "ALLOWED")

	// Relabelling the namespace moves its pods into a selection by
	// namespace label (and gives them new identities).
	nsCNP := &ciliumv2.CiliumNetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "web-from-team-blue", Namespace: e.ns},
		Spec: &api.Rule{
			EndpointSelector: &api.EndpointSelector{MatchLabels: map[string]string{"app": "web"}},
			Ingress: []api.IngressRule{{
				IngressCommonRule: api.IngressCommonRule{FromEndpoints: []api.EndpointSelector{{MatchLabels: map[string]string{"k8s:io.cilium.k8s.namespace.labels.team": "blue"}}}},
			}},
		},
	}
	if _, err := e.cilium.CiliumV2().CiliumNetworkPolicies(e.ns).Create(e.ctx, nsCNP, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPolicies("web's ingress to enforce, nobody of team blue yet", func(p map[string]*ciliumv2.EndpointPolicy) error {
		if !p["web"].Ingress.Enforcing || len(p["web"].Ingress.Allowed) != 0 {
			return fmt.Errorf("web ingress %+v", p["web"].Ingress)
		}
		return nil
	})
	trace("client", "web", "8080/TCP", "DENIED")
	nsPatch := []byte(`{"metadata":{"labels":{"team":"blue"}}}`)
	if _, err := e.cs.CoreV1().Namespaces().Patch(e.ctx, e.ns, types.StrategicMergePatchType, nsPatch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	oldClient := id("client")
	waitPolicies("the relabelled namespace's pods to be allowed into web", func(p map[string]*ciliumv2.EndpointPolicy) error {
		switch {
		case id("client") == oldClient:
			return fmt.Errorf("client kept identity %d after its namespace was relabelled", oldClient)
		case !hasTuple(p["web"].Ingress.Allowed, id("client"), 0, 0):
			return fmt.Errorf("web ingress %+v lacks client's new identity %d", p["web"].Ingress, id("client"))
		}
		return nil
	})
	trace("client", "web", "8080/TCP", "ALLOWED")
}

// policyCLI runs `cellium ARGS...` against the test's agent and returns
// its combined output.
func (e *env) policyCLI(cli string, args ...string) (string, error) {
	out, err := exec.CommandContext(e.ctx, cli, append([]string{"-H", "unix://" + e.node.AgentConfig().SocketPath()}, args...)...).CombinedOutput()
	return string(out), err
}

// hasTuple reports whether the list holds (id, port, proto).
func hasTuple(l []ciliumv2.IdentityTuple, id int64, port uint16, proto uint8) bool {
	return slices.ContainsFunc(l, func(t ciliumv2.IdentityTuple) bool {
		return t.Identity == uint64(id) && t.DestPort == port && t.Protocol == proto
	})
}
