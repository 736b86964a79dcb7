package e2enetpol

import (
	"slices"
	"strings"
	"testing"
)

// TestServicesPlan: the services suite is the 56 Services, Networking
// Granular Checks: Services and HostPort specs of v1.37.2 that are not
// [Conformance] (those 16 are the conformance suite's, and stay out
// without being reported); the 2 [Disruptive] ones are skipped with their
// reason, and the SCTP rule skips the 3 that need SCTP. Nothing of the
// IPv6 dual-stack checks or of other SIGs comes in.
func TestServicesPlan(t *testing.T) {
	r, err := readReport("testdata/services-dryrun.json")
	if err != nil {
		t.Fatal(err)
	}
	c, err := Filter{Suite: Services, Rules: SCTPRule(false, "")}.compile()
	if err != nil {
		t.Fatal(err)
	}
	p := c.plan(r)
	_, skipped := names(t, r, p)
	if len(p.Run)+len(p.Skipped) != 56 {
		t.Fatalf("%d specs in the suite, want 56", len(p.Run)+len(p.Skipped))
	}
	want := []string{
		"[sig-network] Networking Granular Checks: Services should function for endpoint-Service: sctp [Feature:SCTPConnectivity] | SCTP: this kernel has no SCTP",
		"[sig-network] Networking Granular Checks: Services should function for node-Service: sctp [Feature:SCTPConnectivity] | SCTP: this kernel has no SCTP",
		"[sig-network] Networking Granular Checks: Services should function for pod-Service: sctp [Feature:SCTPConnectivity] | SCTP: this kernel has no SCTP",
		"[sig-network] Services should work after restarting apiserver [Disruptive] | " + Services.Rules[0].Reason,
		"[sig-network] Services should work after restarting kube-proxy [Disruptive] | " + Services.Rules[0].Reason,
	}
	if !slices.Equal(skipped, want) {
		t.Errorf("skipped\n  %s\nwant\n  %s", strings.Join(skipped, "\n  "), strings.Join(want, "\n  "))
	}
	if len(p.Run) != 51 {
		t.Errorf("%d to run, want 51", len(p.Run))
	}
	topics := map[string]int{}
	for _, s := range p.Run {
		if strings.Contains(s.Name, "[Conformance]") || strings.Contains(s.Name, "IPv6DualStack") || !strings.HasPrefix(s.Name, "[sig-network] ") {
			t.Errorf("not the suite's: %s", s.Name)
		}
		for _, k := range []string{"NodePort", "nodePort", "externalTrafficPolicy=Local", "session affinity", "HealthCheckNodePort", "internalTrafficPolicy=Local", "hostNetwork"} {
			if strings.Contains(s.Name, k) {
				topics[k]++
			}
		}
	}
	// What the issue asks the suite to cover, each at least once.
	for _, k := range []string{"NodePort", "externalTrafficPolicy=Local", "session affinity", "HealthCheckNodePort", "internalTrafficPolicy=Local"} {
		if topics[k] == 0 {
			t.Errorf("no spec about %s runs", k)
		}
	}
	if _, err := SuiteNamed("services"); err != nil {
		t.Error(err)
	}
}
