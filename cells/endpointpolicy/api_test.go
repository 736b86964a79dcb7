package endpointpolicy

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/cilium/statedb"
	"sigs.k8s.io/yaml"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/policy"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/labels"
	statepolicy "github.com/cellium/cellium/statedb/policy"
)

// apiEngine is an engine with the identities of pods a/web (1000) and
// a/cli (1001) and a CNP letting cli reach web on tcp/80 with an HTTP rule.
func apiEngine(t *testing.T) (*policy.Engine, policy.Endpoint) {
	t.Helper()
	lbls := func(app string) labels.Labels {
		all := labels.FromK8sPod(map[string]string{"app": app}, "a", map[string]string{"kubernetes.io/metadata.name": "a"}, "", "")
		l, _ := labels.DefaultFilter().Split(all)
		return l
	}
	e := policy.NewEngine(policy.ModeDefault)
	e.UpdateIdentities(map[identity.NumericIdentity]labels.Labels{1000: lbls("web"), 1001: lbls("cli")}, nil)
	var cnp ciliumv2.CiliumNetworkPolicy
	if err := yaml.UnmarshalStrict([]byte(`
metadata: {name: web, namespace: a}
spec:
  endpointSelector: {matchLabels: {app: web}}
  ingress: [{fromEndpoints: [{matchLabels: {app: cli}}], toPorts: [{ports: [{port: "80", protocol: TCP}], rules: {http: [{path: /}]}}]}]`), &cnp); err != nil {
		t.Fatal(err)
	}
	rules, err := policy.ParseCNP(&cnp, policy.ParseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e.UpsertRules(policy.Source{Kind: policy.KindCNP, Namespace: "a", Name: "web"}, rules)
	return e, policy.Endpoint{Identity: 1000, Labels: lbls("web")}
}

func TestAPI(t *testing.T) {
	e, web := apiEngine(t)
	db := statedb.New()
	tbl, err := statepolicy.NewTable(db)
	if err != nil {
		t.Fatal(err)
	}
	txn := db.WriteTxn(tbl)
	_, _, _ = tbl.Insert(txn, &statepolicy.EndpointPolicyRow{EndpointID: 7, Identity: web.Identity, Policy: e.Compute(web)})
	txn.Commit()
	mux := http.NewServeMux()
	for _, h := range APIHandlers(e, db, tbl).Handlers {
		mux.HandleFunc(h.Pattern, h.Handler)
	}
	get := func(path string, wantCode int) string {
		t.Helper()
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		if rec.Code != wantCode {
			t.Fatalf("GET %s: %d %s, want %d", path, rec.Code, rec.Body, wantCode)
		}
		return rec.Body.String()
	}
	var pi policy.PolicyInfo
	if err := json.Unmarshal([]byte(get("/policy", 200)), &pi); err != nil {
		t.Fatal(err)
	}
	if len(pi.Rules) != 1 || pi.Rules[0].Name != "CiliumNetworkPolicy/a/web" || pi.Revision != e.Revision() ||
		!strings.Contains(pi.Rules[0].Ingress[0], "allow {any:app=cli, k8s:io.cilium.k8s.policy.cluster=default, k8s:io.kubernetes.pod.namespace=a} on tcp/80") ||
		!strings.Contains(strings.Join(pi.Rules[0].Warnings, ""), "rules.http: L7 rules are not enforced") {
		t.Errorf("GET /policy = %+v", pi)
	}
	if body := get("/policy/selectors", 200); !strings.Contains(body, "any:app=cli") {
		t.Errorf("GET /policy/selectors = %s", body)
	}
	if body := get("/policy/endpoint/7", 200); !strings.Contains(body, `"enforcing": true`) {
		t.Errorf("GET /policy/endpoint/7 = %s", body)
	}
	get("/policy/endpoint/8", 404)
	get("/policy/endpoint/x", 400)
	body := get("/policy/trace?src-identity=1001&dst-identity=1000&dport=80/TCP", 200)
	if !strings.Contains(body, `Final verdict: ALLOWED`) {
		t.Errorf("trace = %s", body)
	}
	body = get("/policy/trace?src-cidr=8.8.8.8&dst-labels="+strings.Join(web.Labels.Strings(), ",")+"&dport=80", 200)
	if !strings.Contains(body, `Final verdict: DENIED`) {
		t.Errorf("trace from world = %s", body)
	}
	for _, bad := range []string{"?dst-identity=1000", "?src-labels=k8s:app=x&src-cidr=1.1.1.1&dst-identity=1000", "?src-identity=1&src-labels=k8s:app=x&dst-identity=1000", "?src-identity=1&dst-identity=2&dport=300/ICMP", "?src-identity=galaxy&dst-identity=1"} {
		get("/policy/trace"+bad, 400)
	}
}

// TestAPIRejected: GET /v1/policy lists the policies the controller
// rejected, sorted, until they are accepted or deleted.
func TestAPIRejected(t *testing.T) {
	e, _ := apiEngine(t)
	db := statedb.New()
	tbl, err := statepolicy.NewTable(db)
	if err != nil {
		t.Fatal(err)
	}
	rej := newRejections()
	mux := http.NewServeMux()
	for _, h := range apiHandlers(e, db, tbl, rej).Handlers {
		mux.HandleFunc(h.Pattern, h.Handler)
	}
	get := func() policy.PolicyInfo {
		t.Helper()
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest("GET", "/policy", nil))
		var pi policy.PolicyInfo
		if err := json.Unmarshal(rec.Body.Bytes(), &pi); err != nil {
			t.Fatal(err)
		}
		return pi
	}
	b := policy.Source{Kind: policy.KindCNP, Namespace: "a", Name: "b"}
	a := policy.Source{Kind: policy.KindCCNP, Name: "a"}
	rej.set(b, fmt.Errorf("spec: ingress[0].toPorts[0].ports[0]: endPort 70 is below port 80"))
	rej.set(a, fmt.Errorf("spec: neither endpointSelector nor nodeSelector is set"))
	pi := get()
	if len(pi.Rejected) != 2 || pi.Rejected[0].Source != a || pi.Rejected[1].Source != b || !strings.Contains(pi.Rejected[1].Error, "endPort 70") {
		t.Errorf("rejected = %+v, want a then b with their errors", pi.Rejected)
	}
	rej.clear(a)
	rej.clear(b)
	if pi := get(); len(pi.Rejected) != 0 {
		t.Errorf("rejected after clearing = %+v", pi.Rejected)
	}
}
