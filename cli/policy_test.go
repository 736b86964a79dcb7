package cli

import (
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/statedb"
	"sigs.k8s.io/yaml"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/cells/agentapi"
	"github.com/cellium/cellium/cells/endpointpolicy"
	"github.com/cellium/cellium/cells/policy"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/labels"
	statepolicy "github.com/cellium/cellium/statedb/policy"
)

// policyAgent serves the real policy API handlers over a unix socket, with
// two pods (client 2000, web 2001) and one CNP, plus GET /v1/endpoint.
func policyAgent(t *testing.T) string {
	t.Helper()
	e := policy.NewEngine(policy.ModeDefault)
	podLabels := func(app string) labels.Labels {
		return labels.ParseLabels("k8s:app="+app, "k8s:io.kubernetes.pod.namespace=default", "k8s:io.cilium.k8s.policy.cluster=default")
	}
	e.UpdateIdentities(map[identity.NumericIdentity]labels.Labels{2000: podLabels("client"), 2001: podLabels("web")}, nil)
	var cnp ciliumv2.CiliumNetworkPolicy
	if err := yaml.Unmarshal([]byte(`
metadata: {name: web, namespace: default}
spec:
  endpointSelector: {matchLabels: {app: web}}
  ingress: [{fromEndpoints: [{matchLabels: {app: client}}], toPorts: [{ports: [{port: "80", protocol: TCP}]}]}]`), &cnp); err != nil {
		t.Fatal(err)
	}
	rules, err := policy.ParseCNP(&cnp, policy.ParseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e.UpsertRules(rules[0].Source, rules)
	db := statedb.New()
	tbl, err := statepolicy.NewTable(db)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	for _, h := range endpointpolicy.APIHandlers(e, db, tbl).Handlers {
		method, path, _ := strings.Cut(h.Pattern, " ")
		mux.HandleFunc(method+" /v1"+path, h.Handler)
	}
	mux.HandleFunc("GET /v1/endpoint", func(w http.ResponseWriter, r *http.Request) {
		ep := func(id int64, pod string, ident int64) models.Endpoint {
			return models.Endpoint{ID: id, Status: models.EndpointStatus{ID: id,
				ExternalIdentifiers: &models.EndpointIdentifiers{PodName: pod},
				Identity:            &models.EndpointIdentity{ID: ident}}}
		}
		agentapi.WriteJSON(w, r, []models.Endpoint{ep(1, "default/client", 2000), ep(2, "default/web", 2001)})
	})
	dir, err := os.MkdirTemp("", "cli")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "cellium.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(mux)
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	return sock
}

func TestPolicyCommands(t *testing.T) {
	sock := policyAgent(t)
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"policy-get", []string{"policy", "get"}},
		{"policy-selectors", []string{"policy", "selectors"}},
		{"policy-trace-allowed", []string{"policy", "trace", "--src-k8s-pod", "default:client", "--dst-k8s-pod", "default:web", "--dport", "80/TCP"}},
		{"policy-trace-denied", []string{"policy", "trace", "--src-cidr", "192.0.2.1", "--dst-identity", "2001", "--dport", "80"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, sock, tc.args...)
			if r.code != 0 || r.stderr != "" {
				t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
			}
			golden(t, tc.name, r.stdout)
		})
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"policy", "trace", "--dst-identity", "2001"}, "give exactly one of --src-identity"},
		{[]string{"policy", "trace", "--src-k8s-pod", "default:nope", "--dst-identity", "2001"}, "no endpoint with an identity for pod default/nope"},
		{[]string{"policy", "trace", "--src-identity", "1", "--dst-identity", "2001", "--dport", "80/GRE"}, "protocol must be TCP, UDP, SCTP or ICMP"},
		{[]string{"policy", "trace", "--src-identity", "1", "--dst-identity", "2001", "--dport", "300/ICMP"}, "an ICMP type is 0 to 255"},
	} {
		r := run(t, sock, tc.args...)
		if r.code == 0 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%v: exit %d, stderr %q, want an error containing %q", tc.args, r.code, r.stderr, tc.want)
		}
	}
}
