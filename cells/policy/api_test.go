package policy

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/cilium/statedb"

	statepolicy "github.com/cellium/cellium/statedb/policy"
)

func TestAPI(t *testing.T) {
	w := cnpWorld(t, ModeDefault)
	w.apply(`
kind: CiliumNetworkPolicy
metadata: {name: web, namespace: a}
spec:
  endpointSelector: {matchLabels: {app: web}}
  ingress: [{fromEndpoints: [{matchLabels: {app: cli}}], toPorts: [{ports: [{port: "80", protocol: TCP}], rules: {http: [{path: /}]}}]}]`)
	db := statedb.New()
	tbl, err := statepolicy.NewTable(db)
	if err != nil {
		t.Fatal(err)
	}
	txn := db.WriteTxn(tbl)
	_, _, _ = tbl.Insert(txn, &statepolicy.EndpointPolicyRow{EndpointID: 7, Identity: w.pods["a/web"].Identity, Policy: w.e.Compute(w.pods["a/web"])})
	txn.Commit()
	mux := http.NewServeMux()
	for _, h := range APIHandlers(w.e, db, tbl).Handlers {
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
	var pi PolicyInfo
	if err := json.Unmarshal([]byte(get("/policy", 200)), &pi); err != nil {
		t.Fatal(err)
	}
	if len(pi.Rules) != 1 || pi.Rules[0].Name != "CiliumNetworkPolicy/a/web" || pi.Revision != w.e.Revision() ||
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
	body = get("/policy/trace?src-cidr=8.8.8.8&dst-labels="+strings.Join(w.pods["a/web"].Labels.Strings(), ",")+"&dport=80", 200)
	if !strings.Contains(body, `Final verdict: DENIED`) {
		t.Errorf("trace from world = %s", body)
	}
	for _, bad := range []string{"?dst-identity=1000", "?src-identity=1&src-cidr=1.1.1.1&dst-identity=1000", "?src-identity=1&dst-identity=2&dport=80/ICMP", "?src-identity=galaxy&dst-identity=1"} {
		get("/policy/trace"+bad, 400)
	}
}

// TestParseDPortICMP: ICMP is a protocol a trace can ask about (the
// datapath looks echoes up with port 0), and it takes no port.
func TestParseDPortICMP(t *testing.T) {
	proto, port, err := ParseDPort("0/icmp")
	if err != nil || proto != statepolicy.ProtoICMP || port != 0 {
		t.Errorf("ParseDPort(0/icmp) = %d, %d, %v; want ICMP, 0", proto, port, err)
	}
	if _, _, err := ParseDPort("8/ICMP"); err == nil {
		t.Error("ParseDPort(8/ICMP): no error")
	}
	if _, _, err := ParseDPort("80/GRE"); err == nil || !strings.Contains(err.Error(), "ICMP") {
		t.Errorf("ParseDPort(80/GRE): %v, want an error naming ICMP", err)
	}
}
