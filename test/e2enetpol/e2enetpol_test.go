package e2enetpol

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestSuiteNamed(t *testing.T) {
	for _, name := range []string{"netpol", "conformance", "services"} {
		if s, err := SuiteNamed(name); err != nil || s.Name != name {
			t.Errorf("SuiteNamed(%q) = %+v, %v", name, s, err)
		}
	}
	if _, err := SuiteNamed("Netpol"); err == nil {
		t.Error("SuiteNamed(Netpol) found a suite")
	}
}

func TestFilterInvalid(t *testing.T) {
	for _, f := range []Filter{{Focus: "("}, {Skip: "[z-a]"}, {Rules: []SkipRule{{Pattern: "(", Reason: "x"}}}} {
		if _, err := f.compile(); err == nil {
			t.Errorf("%+v compiled", f)
		}
	}
}

// names returns the names of the planned specs, and checks that each
// one's focus selects exactly itself among all the report's specs.
func names(t *testing.T, r ginkgoReport, p Plan) (run, skipped []string) {
	t.Helper()
	for _, s := range p.Run {
		run = append(run, s.Name)
		re := regexp.MustCompile(s.Focus)
		var matched []string
		for _, o := range r.SpecReports {
			if o.LeafNodeType == "It" && re.MatchString(o.text(r.SuiteDescription)) {
				matched = append(matched, o.name())
			}
		}
		if len(matched) != 1 || matched[0] != s.Name {
			t.Errorf("focus %s of %q selects %q", s.Focus, s.Name, matched)
		}
	}
	for _, s := range p.Skipped {
		skipped = append(skipped, s.Name+" | "+s.Reason)
		if s.Outcome != Skipped {
			t.Errorf("skipped spec %q has outcome %s", s.Name, s.Outcome)
		}
	}
	return run, skipped
}

func TestPlan(t *testing.T) {
	r, err := readReport("testdata/dryrun.json")
	if err != nil {
		t.Fatal(err)
	}
	const (
		tcp      = "[sig-network] Netpol NetworkPolicy between server and client "
		udp      = "[sig-network] Netpol [LinuxOnly] NetworkPolicy between server and client using UDP "
		sctp     = "[sig-network] Netpol [Feature:SCTPConnectivity] [LinuxOnly] NetworkPolicy between server and client using SCTP "
		api      = "[sig-network] Netpol API should support creating NetworkPolicy API operations"
		deny     = "should support a 'default-deny-ingress' policy [Feature:NetworkPolicy]"
		denyMore = "should support a 'default-deny-ingress' policy [Feature:NetworkPolicy] again"
		allowAll = "should support allow-all policy [Feature:NetworkPolicy]"
		egress   = "should deny egress from pods based on PodSelector [Feature:NetworkPolicy]"
		ports    = "should enforce policy based on Ports [Feature:NetworkPolicy]"
		noSCTP   = "SCTP: this kernel has no SCTP (no module)"
	)
	noSCTPRule := SCTPRule(false, "no module")
	for _, tc := range []struct {
		name         string
		filter       Filter
		run, skipped []string
	}{{
		name:    "all Netpol specs, no SCTP",
		filter:  Filter{Rules: noSCTPRule},
		run:     []string{tcp + deny, tcp + denyMore, tcp + allowAll, tcp + egress, udp + deny, api},
		skipped: []string{sctp + deny + " | " + noSCTP, sctp + ports + " | " + noSCTP},
	}, {
		name:   "all Netpol specs with SCTP",
		filter: Filter{Rules: SCTPRule(true, "")},
		run:    []string{tcp + deny, tcp + denyMore, tcp + allowAll, tcp + egress, udp + deny, sctp + deny, sctp + ports, api},
	}, {
		// Not the Services spec, nor NetworkPolicyLegacy's spec of the
		// same name: only Netpol's.
		name:    "focus on default-deny-ingress",
		filter:  Filter{Focus: "default-deny-ingress", Rules: noSCTPRule},
		run:     []string{tcp + deny, tcp + denyMore, udp + deny},
		skipped: []string{sctp + deny + " | " + noSCTP},
	}, {
		name:   "focus on two, anchored",
		filter: Filter{Focus: `default-deny-ingress' policy \[Feature:NetworkPolicy\]$|allow-all`},
		run:    []string{tcp + deny, tcp + allowAll, udp + deny, sctp + deny},
	}, {
		name:    "skip egress and UDP",
		filter:  Filter{Skip: "egress|UDP"},
		run:     []string{tcp + deny, tcp + denyMore, tcp + allowAll, sctp + deny, sctp + ports, api},
		skipped: []string{tcp + egress + " | matches SKIP=egress|UDP", udp + deny + " | matches SKIP=egress|UDP"},
	}, {
		name:   "focus on nothing there",
		filter: Filter{Focus: "no such spec"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := tc.filter.compile()
			if err != nil {
				t.Fatal(err)
			}
			run, skipped := names(t, r, c.plan(r))
			slices.Sort(tc.run)
			slices.Sort(tc.skipped)
			if !slices.Equal(run, tc.run) {
				t.Errorf("run\n  %s\nwant\n  %s", strings.Join(run, "\n  "), strings.Join(tc.run, "\n  "))
			}
			if !slices.Equal(skipped, tc.skipped) {
				t.Errorf("skipped\n  %s\nwant\n  %s", strings.Join(skipped, "\n  "), strings.Join(tc.skipped, "\n  "))
			}
		})
	}
}

func TestResults(t *testing.T) {
	r, err := readReport("testdata/run.json")
	if err != nil {
		t.Fatal(err)
	}
	if r.SuiteDescription != "Kubernetes e2e suite" || r.RunTime != 190*time.Second || len(r.SpecReports) != 6 {
		t.Fatalf("report %+v", r)
	}
	var sum Summary
	for _, s := range r.SpecReports {
		if s.LeafNodeType == "It" && strings.Contains(s.name(), "Netpol") {
			sum.Results = append(sum.Results, resultOf(s))
		}
	}
	sum.Results = append(sum.Results, Result{Name: "[sig-network] Netpol [Feature:SCTPConnectivity] x", Outcome: Skipped, Reason: "SCTP: this kernel has no SCTP"})
	sum.RunTime = 190 * time.Second
	if got := []int{sum.Count(Passed), sum.Count(Failed), sum.Count(Skipped)}; !slices.Equal(got, []int{1, 2, 2}) {
		t.Errorf("passed, failed, skipped = %v, want [1 2 2]", got)
	}
	f := sum.Failures()
	if len(f) != 2 {
		t.Fatalf("failures %+v", f)
	}
	if f[0].Name != "[sig-network] Netpol NetworkPolicy between server and client should deny egress from pods based on PodSelector [Feature:NetworkPolicy]" ||
		f[0].RunTime != 2*time.Minute ||
		!strings.HasPrefix(f[0].Reason, "failed: Had 3 wrong results in reachability matrix") ||
		!strings.Contains(f[0].Reason, "at k8s.io/kubernetes/test/e2e/network/netpol/test_helper.go:125") {
		t.Errorf("first failure %+v", f[0])
	}
	if !strings.HasPrefix(f[1].Reason, "timedout: A suite timeout occurred") {
		t.Errorf("second failure %+v", f[1])
	}
	var out strings.Builder
	if err := sum.Write(&out); err != nil {
		t.Fatal(err)
	}
	want := `Netpol: 1 passed, 2 failed, 2 skipped of 5 specs in 3m10s
failed:
  [sig-network] Netpol NetworkPolicy between server and client should deny egress from pods based on PodSelector [Feature:NetworkPolicy] (2m0s)
      failed: Had 3 wrong results in reachability matrix ...
  [sig-network] Netpol API should support creating NetworkPolicy API operations (10m0s)
      timedout: A suite timeout occurred ...
skipped (Only supported for node OS distro [gci ubuntu custom] (not windows)):
  [sig-network] Netpol [LinuxOnly] NetworkPolicy between server and client using UDP should support a 'default-deny-ingress' policy [Feature:NetworkPolicy]
skipped (SCTP: this kernel has no SCTP):
  [sig-network] Netpol [Feature:SCTPConnectivity] x
`
	if out.String() != want {
		t.Errorf("summary:\n%s\nwant:\n%s", out.String(), want)
	}
}

func TestParseReportErrors(t *testing.T) {
	for _, in := range []string{"", "{}", "[]", `[{"SuiteDescription":"a"},{"SuiteDescription":"b"}]`} {
		if _, err := parseReport(strings.NewReader(in)); err == nil {
			t.Errorf("parseReport(%q) succeeded", in)
		}
	}
}

func TestAgnhostImageName(t *testing.T) {
	src := []byte(`
func initReg() RegistryList {
	registry := RegistryList{
		GcAuthenticatedRegistry:  "gcr.io/authenticated-image-pulling",
		PromoterE2eRegistry:      "registry.k8s.io/e2e-test-images",
		BuildImageRegistry:       "registry.k8s.io/build-image",
	}
}
func initImageConfigs(list RegistryList) (map[ImageID]Config, map[ImageID]Config) {
	configs := map[ImageID]Config{}
	configs[AgnhostPrev] = Config{list.PromoterE2eRegistry, "agnhost", "2.55"}
	configs[Agnhost] = Config{list.PromoterE2eRegistry, "agnhost", "2.66.1"}
	configs[AgnhostPrivate] = Config{list.PrivateRegistry, "agnhost", "2.6"}
}`)
	got, err := agnhostImageName(src)
	if err != nil || got != "registry.k8s.io/e2e-test-images/agnhost:2.66.1" {
		t.Errorf("agnhostImageName = %q, %v", got, err)
	}
	if _, err := agnhostImageName([]byte("package image")); err == nil {
		t.Error("no error for sources without the agnhost line")
	}
}

// TestTrimReport: the trimmed report keeps the specs that ran (and the
// skipped one with a reason) and drops those the focus left out; it still
// parses the same.
func TestTrimReport(t *testing.T) {
	data, err := os.ReadFile("testdata/run.json")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "r.json")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := trimReport(path); err != nil {
		t.Fatal(err)
	}
	r, err := readReport(path)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range r.SpecReports {
		names = append(names, s.LeafNodeType+" "+s.State+" "+s.LeafNodeText)
	}
	want := []string{
		"SynchronizedBeforeSuite passed ",
		"It passed should support a 'default-deny-ingress' policy [Feature:NetworkPolicy]",
		"It failed should deny egress from pods based on PodSelector [Feature:NetworkPolicy]",
		"It skipped should support a 'default-deny-ingress' policy [Feature:NetworkPolicy]",
		"It timedout should support creating NetworkPolicy API operations",
	}
	if !slices.Equal(names, want) {
		t.Errorf("trimmed report has\n  %s\nwant\n  %s", strings.Join(names, "\n  "), strings.Join(want, "\n  "))
	}
	if r.RunTime != 190*time.Second || r.SuiteDescription != "Kubernetes e2e suite" {
		t.Errorf("suite fields lost: %+v", r)
	}
	if err := trimReport(filepath.Join(t.TempDir(), "missing.json")); err == nil {
		t.Error("no error for a missing report")
	}
}

func TestPlacement(t *testing.T) {
	t0 := time.Now()
	p := &Placement{seen: map[string]bool{}}
	pod := func(uid, node string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid)}, Spec: corev1.PodSpec{NodeName: node}}
	}
	p.note(pod("a", ""))       // not bound yet: not counted
	p.note(pod("a", "node-2")) // bound
	p.note(pod("b", "node-1"))
	p.note(pod("a", "node-3")) // the same pod again: its first binding stays
	t1 := time.Now()
	if got := p.Nodes(t0, t1); !slices.Equal(got, []string{"node-1", "node-2"}) {
		t.Errorf("Nodes = %v, want [node-1 node-2]", got)
	}
	if got := p.Nodes(t1.Add(time.Second), t1.Add(2*time.Second)); got != nil {
		t.Errorf("Nodes of a later spec = %v, want none", got)
	}
	if got := (*Placement)(nil).Nodes(t0, t1); got != nil {
		t.Errorf("nil Placement: %v", got)
	}

	sum := Summary{Suite: "Netpol", RunTime: time.Minute, Results: []Result{
		{Name: "a", Outcome: Passed, Nodes: []string{"node-1", "node-2"}},
		{Name: "b", Outcome: Passed, Nodes: []string{"node-3"}},
		{Name: "c", Outcome: Passed},
	}}
	var out strings.Builder
	if err := sum.Write(&out); err != nil {
		t.Fatal(err)
	}
	if want := "pods' nodes: 1 of the 2 specs that ran pods had them on two or more nodes (node-1, node-2, node-3)\n"; !strings.Contains(out.String(), want) {
		t.Errorf("summary:\n%s\nwant a line %q", out.String(), want)
	}
}
