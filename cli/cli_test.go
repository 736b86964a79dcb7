package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/goleak"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/v1/client"
	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/cells/agentapi"
	"github.com/cellium/cellium/cells/hive"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the commands' output")

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// result is what one run of the command printed and returned.
type result struct {
	stdout, stderr string
	code           int
}

// run executes `cellium -H unix://sock args...`.
func run(t *testing.T, sock string, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	code := Run(context.Background(), append([]string{"-H", "unix://" + sock}, args...),
		Options{Out: &out, Err: &errOut, Now: func() time.Time { return testNow }})
	return result{out.String(), errOut.String(), code}
}

// golden compares got with testdata/name.golden (rewritten with -update).
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("output differs from %s (go test -update rewrites it):\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

// TestGolden runs each command against the healthy fake agent and
// compares its output with a golden file.
func TestGolden(t *testing.T) {
	sock := newFakeAgent().start(t)
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"status", []string{"status"}},
		{"status-verbose", []string{"status", "--verbose"}},
		{"status-brief", []string{"status", "--brief"}},
		{"status-json", []string{"status", "-o", "json"}},
		{"endpoint-list", []string{"endpoint", "list"}},
		{"endpoint-ls-no-headers", []string{"endpoint", "ls", "--no-headers"}},
		{"endpoint-list-json", []string{"endpoint", "list", "-o", "json"}},
		{"endpoint-list-jsonpath", []string{"endpoint", "list", "-o", "jsonpath={range [*]}{.id} {.status.state}{\"\\n\"}{end}"}},
		{"endpoint-get", []string{"endpoint", "get", "1090"}},
		{"endpoint-get-yaml", []string{"endpoint", "get", "1090", "-o", "yaml"}},
		{"endpoint-get-jsonpath", []string{"endpoint", "get", "1090", "-o", "jsonpath='{.status.identity.id} {.status.networking.addressing[0].ipv4}'"}},
		{"endpoint-regenerate", []string{"endpoint", "regenerate", "1090"}},
		{"endpoint-labels", []string{"endpoint", "labels", "142"}},
		{"identity-list", []string{"identity", "list"}},
		{"identity-list-labels", []string{"identity", "ls", "app=web", "k8s:io.kubernetes.pod.namespace=default"}},
		{"identity-list-endpoints", []string{"identity", "list", "--endpoints"}},
		{"identity-list-endpoints-json", []string{"identity", "list", "--endpoints", "-o", "json"}},
		{"identity-get", []string{"identity", "get", "48213"}},
		{"identity-get-json", []string{"identity", "get", "4", "-o", "json"}},
		{"node-list", []string{"node", "list"}},
		{"node-list-yaml", []string{"node", "ls", "-o", "yaml"}},
		{"ipcache-list", []string{"ipcache", "list"}},
		{"health-status", []string{"health", "status"}},
		{"health-status-json", []string{"health", "status", "-o", "json"}},
		{"service-list", []string{"service", "list"}},
		{"service-list-json", []string{"service", "ls", "-o", "json"}},
		{"config", []string{"config"}},
		{"config-json", []string{"config", "-o", "json"}},
		{"config-get", []string{"config", "get", "K8sClientQPS"}},
		{"config-get-node-name", []string{"config", "get", "node-name"}},
		{"statedb", []string{"statedb"}},
		{"statedb-table", []string{"statedb", "endpoints"}},
		{"statedb-table-yaml", []string{"statedb", "endpoints", "-o", "yaml"}},
		{"statedb-table-jsonpath", []string{"statedb", "endpoints", "-o", "jsonpath='{[*].id}'"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, sock, tc.args...)
			if r.code != 0 || r.stderr != "" {
				t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
			}
			golden(t, tc.name, r.stdout)
		})
	}
}

// TestErrors checks the exit code and the message of commands that fail.
func TestErrors(t *testing.T) {
	f := newFakeAgent()
	sock := f.start(t)

	notServing := newFakeAgent()
	notServing.Missing = []string{"GET /identity", "GET /node", "GET /config"}
	oldSock := notServing.start(t)

	dir, err := os.MkdirTemp("", "cli")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	missing := filepath.Join(dir, "missing.sock")
	stale := filepath.Join(dir, "stale.sock")
	ln, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()

	for _, tc := range []struct {
		name string
		sock string
		args []string
		want string // the whole of stderr
	}{
		{"agent down", missing, []string{"status"},
			"Error: cannot reach the cellium agent at unix://" + missing + ": is cellium-agent running? (-H to use another socket)\n"},
		{"stale socket", stale, []string{"endpoint", "list"},
			"Error: cannot reach the cellium agent at unix://" + stale + ": is cellium-agent running? (-H to use another socket)\n"},
		{"endpoint not found", sock, []string{"endpoint", "get", "999"},
			"Error: endpoint 999 not found on this node: 'cellium endpoint list' shows its endpoints\n"},
		{"endpoint ID invalid", sock, []string{"endpoint", "get", "web-0"},
			"Error: get endpoint web-0: the agent answered 400: endpoint ID \"web-0\": want a number from 1 to 4095\n"},
		{"regenerate not found", sock, []string{"endpoint", "regenerate", "5"},
			"Error: endpoint 5 not found on this node: 'cellium endpoint list' shows its endpoints\n"},
		{"endpoint get without ID", sock, []string{"endpoint", "get"},
			"Error: cellium endpoint get takes one endpoint ID, got 0 arguments ('cellium endpoint list' lists them)\n"},
		{"identity not found", sock, []string{"identity", "get", "5555"},
			"Error: identity 5555 not found: 'cellium identity list' shows the identities the agent knows\n"},
		{"identities not served", oldSock, []string{"identity", "list"},
			"Error: list identities: the agent does not serve GET /v1/identity: is it older than this cellium CLI?\n"},
		{"config unknown", sock, []string{"config", "get", "no-such-flag"},
			"Error: configuration \"no-such-flag\" does not exist: 'cellium config' lists them\n"},
		{"statedb unknown table", sock, []string{"statedb", "nope"},
			"Error: dump statedb table nope: the agent answered 404: no table \"nope\"; tables: endpoints, k8s-pods\n"},
		{"bad output", sock, []string{"endpoint", "list", "-o", "xml"},
			"Error: unknown output format -o \"xml\": use json, yaml or jsonpath='{...}'\n"},
		{"bad jsonpath", sock, []string{"endpoint", "get", "1090", "-o", "jsonpath={.status"},
			"Error: invalid -o jsonpath template \"{.status\": unclosed action\n"},
		{"bad host", sock, []string{"-H", "tcp://127.0.0.1:80", "status"},
			"Error: invalid -H \"tcp://127.0.0.1:80\": the agent listens on a unix socket; give it as unix:///path/to/cellium.sock\n"},
		{"bad label to add", sock, []string{"endpoint", "labels", "1090", "--add", "=x"},
			"Error: invalid --add \"=x\": want [source:]key[=value], e.g. --add k8s:team=blue\n"},
		{"unknown flag", sock, []string{"endpoint", "list", "--wide"},
			"Error: unknown flag: --wide (see 'cellium endpoint list --help')\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, tc.sock, tc.args...)
			if r.code != 1 {
				t.Errorf("exit code %d, want 1", r.code)
			}
			if r.stderr != tc.want {
				t.Errorf("stderr\n got %q\nwant %q", r.stderr, tc.want)
			}
			if r.stdout != "" {
				t.Errorf("stdout %q, want nothing", r.stdout)
			}
		})
	}
}

// TestStatusDegraded: status prints everything, lists the degraded
// modules, and exits 1 with why; sections the agent does not serve are
// shown as unavailable.
func TestStatusDegraded(t *testing.T) {
	f := newFakeAgent()
	f.Health.State = "Degraded"
	f.Health.Modules[1] = models.ModuleHealth{ID: "cepsync", Module: "cepsync", Level: string(hive.LevelDegraded),
		Message: "update CiliumEndpoint default/web-0", Error: "the server is currently unable to handle the request",
		Since: testNow.Add(-42 * time.Second)}
	f.Missing = []string{"GET /identity", "GET /node"}
	f.Health.ClusterHealth.Reachable = 0
	f.Health.ClusterHealth.Probes[0].Reachable = false
	f.Health.ClusterHealth.Probes[0].Error = "GET 10.0.0.12:4240/hello: dial tcp 10.0.0.12:4240: connect: connection refused"
	sock := f.start(t)

	r := run(t, sock, "status")
	if r.code != 1 {
		t.Errorf("exit code %d, want 1", r.code)
	}
	golden(t, "status-degraded", r.stdout)
	want := "Error: the cellium agent is Degraded: cepsync: update CiliumEndpoint default/web-0: the server is currently unable to handle the request\n"
	if r.stderr != want {
		t.Errorf("stderr\n got %q\nwant %q", r.stderr, want)
	}

	r = run(t, sock, "status", "--brief")
	if r.code != 1 || r.stdout != "" || r.stderr != want {
		t.Errorf("status --brief: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}

// TestTimeout: an agent that accepts but never answers is given up on
// after --timeout with a message saying so.
func TestTimeout(t *testing.T) {
	f := newFakeAgent()
	f.Hang = true
	sock := f.start(t)
	start := time.Now()
	r := run(t, sock, "--timeout", "200ms", "endpoint", "list")
	if elapsed := time.Since(start); elapsed > 10*time.Second {
		t.Errorf("took %s", elapsed)
	}
	want := "Error: the cellium agent at unix://" + sock + " did not answer within 200ms (--timeout to wait longer)\n"
	if r.code != 1 || r.stderr != want {
		t.Errorf("exit %d, stderr %q, want %q", r.code, r.stderr, want)
	}
}

// TestEndpointGetStatusIsCEPStatus: `endpoint get ID -o json` prints an
// object whose .status is, as JSON, exactly the .status of a
// CiliumEndpoint carrying the same status; -o yaml decodes to the same
// status. Every field of the status is set, so a field the client or
// the CLI dropped or re-typed would show.
func TestEndpointGetStatusIsCEPStatus(t *testing.T) {
	sock := newFakeAgent().start(t)
	cep := ciliumv2.CiliumEndpoint{
		TypeMeta:   metav1.TypeMeta{APIVersion: "cilium.io/v2", Kind: "CiliumEndpoint"},
		ObjectMeta: metav1.ObjectMeta{Name: "web-0", Namespace: "default"},
		Status:     webStatus(),
	}
	cepJSON, err := json.Marshal(cep)
	if err != nil {
		t.Fatal(err)
	}
	wantStatus := field(t, cepJSON, "status")

	r := run(t, sock, "endpoint", "get", "1090", "-o", "json")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	if got := field(t, []byte(r.stdout), "status"); got != wantStatus {
		t.Errorf(".status differs from the CEP's:\n got %s\nwant %s", got, wantStatus)
	}
	var ep models.Endpoint
	if err := json.Unmarshal([]byte(r.stdout), &ep); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(ep.Status, asModel(cep.Status)) {
		t.Errorf("decoded status differs:\n got %+v\nwant %+v", ep.Status, cep.Status)
	}

	r = run(t, sock, "endpoint", "get", "1090", "-o", "yaml")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	asJSON, err := yaml.YAMLToJSON([]byte(r.stdout))
	if err != nil {
		t.Fatal(err)
	}
	var fromYAML models.Endpoint
	if err := json.Unmarshal(asJSON, &fromYAML); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(fromYAML.Status, asModel(cep.Status)) {
		t.Errorf("status from -o yaml differs:\n got %+v\nwant %+v", fromYAML.Status, cep.Status)
	}
}

// field returns the compact JSON of obj's top-level key.
func field(t *testing.T, obj []byte, key string) string {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(obj, &m); err != nil {
		t.Fatalf("decode %s: %v", obj, err)
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, m[key]); err != nil {
		t.Fatalf("compact .%s: %v", key, err)
	}
	return buf.String()
}

// TestEndpointLabels: --add and --delete become one PATCH with the
// agent's LabelsPatch body, and the endpoint's new labels are printed.
func TestEndpointLabels(t *testing.T) {
	f := newFakeAgent()
	sock := f.start(t)
	r := run(t, sock, "endpoint", "labels", "1090", "--add", "k8s:team=blue", "--add", "tier", "--delete", "k8s:app")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	golden(t, "endpoint-labels-patch", r.stdout)

	var patch *models.LabelsPatch
	for _, req := range f.seen() {
		if body, ok := strings.CutPrefix(req, "PATCH /v1/endpoint/1090/labels "); ok {
			if err := json.Unmarshal([]byte(body), &patch); err != nil {
				t.Fatal(err)
			}
		}
	}
	want := &models.LabelsPatch{Add: map[string]string{"k8s:team": "blue", "tier": ""}, Delete: []string{"k8s:app"}}
	if !reflect.DeepEqual(patch, want) {
		t.Errorf("PATCH body %+v, want %+v (requests: %q)", patch, want, f.seen())
	}
}

// TestSocketPath: -H takes unix:///path or a bare path, nothing else.
func TestSocketPath(t *testing.T) {
	for _, tc := range []struct {
		host, want string
		err        bool
	}{
		{"", client.DefaultSocketPath, false},
		{"unix:///run/c.sock", "/run/c.sock", false},
		{"/run/c.sock", "/run/c.sock", false},
		{"unix://", "", true},
		{"tcp://localhost:80", "", true},
		{"http://localhost", "", true},
	} {
		got, err := socketPath(tc.host)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("socketPath(%q) = %q, %v; want %q, error %v", tc.host, got, err, tc.want, tc.err)
		}
	}
	if client.DefaultSocketPath != agentapi.DefaultSocketPath {
		t.Errorf("the client's default socket %s is not the agent's %s", client.DefaultSocketPath, agentapi.DefaultSocketPath)
	}
}

// TestEnforcement maps the CEP's policy directions to cilium-dbg's words.
func TestEnforcement(t *testing.T) {
	for _, tc := range []struct {
		d    *models.EndpointPolicyDirection
		want string
	}{
		{nil, "Disabled"},
		{&models.EndpointPolicyDirection{}, "Disabled"},
		{&models.EndpointPolicyDirection{Enforcing: true}, "Enabled"},
		{&models.EndpointPolicyDirection{State: models.EndpointPolicyStateEnforcing}, "Enabled"},
		{&models.EndpointPolicyDirection{State: models.EndpointPolicyStateNonEnforcing}, "Disabled"},
		{&models.EndpointPolicyDirection{Enforcing: true, State: models.EndpointPolicyStateDisabled}, "Disabled"},
		{&models.EndpointPolicyDirection{State: "bogus"}, "Unknown"},
	} {
		if got := enforcement(tc.d); got != tc.want {
			t.Errorf("enforcement(%+v) = %q, want %q", tc.d, got, tc.want)
		}
	}
}

// TestParseOutput covers the accepted -o spellings.
func TestParseOutput(t *testing.T) {
	for _, s := range []string{"", "json", "yaml", "jsonpath={.id}", "jsonpath='{.id}'", `jsonpath="{.id}"`} {
		if _, err := parseOutput(s); err != nil {
			t.Errorf("parseOutput(%q): %v", s, err)
		}
	}
	for _, s := range []string{"xml", "wide", "jsonpath", "jsonpath=", "jsonpath=''", "jsonpath={.id"} {
		if _, err := parseOutput(s); err == nil {
			t.Errorf("parseOutput(%q) accepted", s)
		}
	}
}

// TestExplainTransport: a socket the caller may not open gets its own
// hint instead of "is cellium-agent running?".
func TestExplainTransport(t *testing.T) {
	a := &app{timeout: time.Second}
	denied := fmt.Errorf("%w: connect to /s: %w", client.ErrAgentUnreachable, syscall.EACCES)
	want := "cannot reach the cellium agent at unix:///s: permission denied: the socket is mode 0660, run cellium as root (or a member of the socket's group)"
	if got := a.explainTransport(denied, "/s"); got == nil || got.Error() != want {
		t.Errorf("got %v, want %s", got, want)
	}
	other := errors.New("agent API GET /v1/endpoint: decode reply: EOF")
	if got := a.explainTransport(other, "/s"); got != other {
		t.Errorf("got %v, want the error unchanged", got)
	}
}

// TestDocumentation: Documentation/operations/cli.md names every command
// and every flag, so that a new one cannot go undocumented.
func TestDocumentation(t *testing.T) {
	doc, err := os.ReadFile("../Documentation/operations/cli.md")
	if err != nil {
		t.Fatal(err)
	}
	var walk func(cmd *cobra.Command)
	walk = func(cmd *cobra.Command) {
		if cmd.Hidden || cmd.Name() == "help" || cmd.Name() == "completion" {
			return
		}
		if cmd.HasParent() && !bytes.Contains(doc, []byte(cmd.CommandPath())) {
			t.Errorf("cli.md does not mention %q", cmd.CommandPath())
		}
		cmd.LocalFlags().VisitAll(func(f *pflag.Flag) {
			if f.Name == "help" {
				return
			}
			if !bytes.Contains(doc, []byte("--"+f.Name)) && (f.Shorthand == "" || !bytes.Contains(doc, []byte("-"+f.Shorthand))) {
				t.Errorf("cli.md does not mention flag --%s of %q", f.Name, cmd.CommandPath())
			}
		})
		for _, c := range cmd.Commands() {
			walk(c)
		}
	}
	walk(NewCommand(Options{}))
}

// TestSocketEnv: without -H the CLI talks to the socket $CELLIUM_SOCK
// names (the agent's DaemonSet sets it, so `kubectl exec ds/cellium-agent
// -- cellium status` needs no -H); -H still wins.
func TestSocketEnv(t *testing.T) {
	sock := newFakeAgent().start(t)
	env := func(k string) string {
		if k == SocketEnv {
			return sock
		}
		return ""
	}
	var out, errOut bytes.Buffer
	code := Run(context.Background(), []string{"status", "--brief"},
		Options{Out: &out, Err: &errOut, Now: func() time.Time { return testNow }, Getenv: env})
	if code != 0 {
		t.Fatalf("status with %s=%s: exit %d: %s", SocketEnv, sock, code, errOut.String())
	}
	out.Reset()
	errOut.Reset()
	code = Run(context.Background(), []string{"-H", "unix://" + sock + ".missing", "status", "--brief"},
		Options{Out: &out, Err: &errOut, Getenv: env})
	if code != 1 || !strings.Contains(errOut.String(), ".missing") {
		t.Errorf("-H given: exit %d, stderr %q (want -H to win over %s)", code, errOut.String(), SocketEnv)
	}
}
