package operator_test

import (
	"bytes"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/cellium/cellium/operator"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	t.Setenv("KUBERNETES_SERVICE_HOST", "") // never in-cluster here
	var out bytes.Buffer
	cmd := operator.NewCommand(operator.Operator)
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

// The whole operator graph builds: a wiring mistake fails here.
func TestHiveCommandPrintsModuleTree(t *testing.T) {
	out, err := run(t, "hive", "--leader-election=false")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"Ⓜ️ operator (Cellium Operator):",
		"Ⓜ️ crd-register (Registers the cilium.io CRDs):",
		"--leader-election=false (default true)",
		"--skip-crd-creation=false (default false)",
		"• register-crds (operator.operator-infra.crd-register)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("operator hive output lacks %q", want)
		}
	}
}

func TestInvalidFlagValueNamesFlag(t *testing.T) {
	_, err := run(t, "hive", "--leader-election-lease-duration=1s")
	if err == nil || !strings.Contains(err.Error(), "leader-election-lease-duration") {
		t.Errorf("want an error naming --leader-election-lease-duration, got %v", err)
	}
}

// The service map is in the operator, off by default, and refuses to start
// without a flow source.
func TestServiceMapFlags(t *testing.T) {
	out, err := run(t, "hive", "--leader-election=false")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"Ⓜ️ hubble-service-map (Live service map of Hubble flows in the browser):",
		`--hubble-service-map-listen-address="" (default "")`,
		`--hubble-relay-address="" (default "")`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("operator hive output lacks %q", want)
		}
	}
	_, err = run(t, "hive", "--hubble-service-map-listen-address=localhost:12000")
	if err == nil || !strings.Contains(err.Error(), "give --hubble-relay-address") {
		t.Errorf("want an error asking for --hubble-relay-address, got %v", err)
	}
}

// The slice batcher is in the operator graph, off by default; with
// --enable-cilium-endpoint-slice its table and job wire up, and a slice
// mode other than identity is refused with the flag's name.
func TestCiliumEndpointSliceFlags(t *testing.T) {
	out, err := run(t, "hive", "--leader-election=false")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"Ⓜ️ ces-batcher (Batches CiliumEndpoints into CiliumEndpointSlices):",
		"--enable-cilium-endpoint-slice=false (default false)",
		"--ces-max-ciliumendpoints-per-ces=100 (default 100)",
		"--ces-slice-mode=identity (default identity)",
		`--ces-rate-limits=[{"nodes":0,"limit":10,"burst":20}] (default [{"nodes":0,"limit":10,"burst":20}])`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("operator hive output lacks %q", want)
		}
	}
	out, err = run(t, "hive", "--leader-election=false", "--enable-cilium-endpoint-slice")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "job-reflect-k8s-cilium-endpoint-slices") {
		t.Errorf("with --enable-cilium-endpoint-slice the hive has no slice table:\n%s", out)
	}
	if _, err := run(t, "hive", "--leader-election=false", "--enable-cilium-endpoint-slice", "--ces-slice-mode=fcfs"); err == nil || !strings.Contains(err.Error(), "--ces-slice-mode") {
		t.Errorf("--ces-slice-mode=fcfs: err = %v, want one naming the flag", err)
	}
	// --help shows --ces-rate-limits, not the deprecated flags.
	if help, err := run(t, "--help"); err != nil || !strings.Contains(help, "--ces-rate-limits") || strings.Contains(help, "--ces-write-qps") {
		t.Errorf("--help (err %v) should list --ces-rate-limits and hide --ces-write-qps-*:\n%s", err, help)
	}
	// Cilium v1.20's stepped rate; the deprecated fixed rate alone; both.
	if _, err := run(t, "hive", "--leader-election=false", "--enable-cilium-endpoint-slice",
		`--ces-rate-limits=[{"nodes":0,"limit":10,"burst":20},{"nodes":100,"limit":50,"burst":100}]`); err != nil {
		t.Errorf("--ces-rate-limits with the chart's steps: %v", err)
	}
	if _, err := run(t, "hive", "--leader-election=false", "--enable-cilium-endpoint-slice", `--ces-rate-limits=[{"nodes":0,"limit":60,"burst":20}]`); err == nil || !strings.Contains(err.Error(), "--ces-rate-limits") {
		t.Errorf("--ces-rate-limits with limit 60: err = %v, want one naming the flag", err)
	}
	if _, err := run(t, "hive", "--leader-election=false", "--enable-cilium-endpoint-slice", "--ces-write-qps-limit=50", "--ces-write-qps-burst=100"); err != nil {
		t.Errorf("the deprecated --ces-write-qps-*: %v", err)
	}
	if _, err := run(t, "hive", "--leader-election=false", "--enable-cilium-endpoint-slice", "--ces-write-qps-limit=50",
		`--ces-rate-limits=[{"nodes":0,"limit":10,"burst":20}]`); err == nil || !strings.Contains(err.Error(), "set only --ces-rate-limits") {
		t.Errorf("--ces-write-qps-limit with --ces-rate-limits: err = %v, want one asking for --ces-rate-limits only", err)
	}
}

// The kvstore nodes GC is in the operator graph with Cilium's flags, and
// a bad --cluster-name or --cilium-pod-labels stops the start naming the flag.
func TestKVStoreNodesGCFlags(t *testing.T) {
	out, err := run(t, "hive", "--leader-election=false")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"Ⓜ️ kvstore-nodes-gc (GC of stale KVStore node entries):",
		"--synchronize-k8s-nodes=true (default true)",
		"--cluster-name=default (default default)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("operator hive output lacks %q", want)
		}
	}
	for _, arg := range []string{"--cluster-name=a/b", "--cilium-pod-labels=a=(b"} {
		flag := strings.TrimPrefix(strings.SplitN(arg, "=", 2)[0], "--")
		if _, err := run(t, "hive", "--leader-election=false", arg); err == nil || !strings.Contains(err.Error(), flag) {
			t.Errorf("%s: err = %v, want one naming --%s", arg, err, flag)
		}
	}
}
