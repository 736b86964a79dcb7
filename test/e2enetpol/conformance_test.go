package e2enetpol

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestConformancePlan: the conformance suite is sig-network's 47
// [Conformance] specs of v1.37.2 (the dry run also lists DNS specs that
// are not conformance: they stay out), and the DNS rule skips exactly the
// 16 that resolve names through the cluster's DNS server: 5 DNS specs and
// 11 Services specs that reach their Service by name first.
func TestConformancePlan(t *testing.T) {
	r, err := readReport("testdata/conformance-dryrun.json")
	if err != nil {
		t.Fatal(err)
	}
	c, err := Filter{Suite: Conformance}.compile()
	if err != nil {
		t.Fatal(err)
	}
	p := c.plan(r)
	if len(p.Run) != 47 || len(p.Skipped) != 0 {
		t.Fatalf("%d to run, %d skipped, want 47 and 0", len(p.Run), len(p.Skipped))
	}
	names(t, r, p)
	for _, s := range p.Run {
		if !strings.HasPrefix(s.Name, "[sig-network] ") || !strings.Contains(s.Name, "[Conformance]") {
			t.Errorf("not a sig-network conformance spec: %s", s.Name)
		}
	}
	noDNS := SkipRule{Pattern: DNSPattern, Reason: "DNS: none"}
	p, err = p.Skip(noDNS)
	if err != nil {
		t.Fatal(err)
	}
	var skipped []string
	for _, s := range p.Skipped {
		if s.Reason != noDNS.Reason || s.Outcome != Skipped {
			t.Errorf("skipped %+v", s)
		}
		skipped = append(skipped, s.Name)
	}
	want := []string{
		"[sig-network] DNS should provide DNS for ExternalName services [Conformance]",
		"[sig-network] DNS should provide DNS for pods for Subdomain [Conformance]",
		"[sig-network] DNS should provide DNS for services [Conformance]",
		"[sig-network] DNS should provide DNS for the cluster [Conformance]",
		"[sig-network] DNS should resolve DNS of partial qualified names for services [LinuxOnly] [Conformance]",
		"[sig-network] Services should be able to change the type from ClusterIP to ExternalName [Conformance]",
		"[sig-network] Services should be able to change the type from ExternalName to ClusterIP [Conformance]",
		"[sig-network] Services should be able to change the type from ExternalName to NodePort [Conformance]",
		"[sig-network] Services should be able to change the type from NodePort to ExternalName [Conformance]",
		"[sig-network] Services should be able to create a functioning NodePort service [Conformance]",
		"[sig-network] Services should be able to switch session affinity for NodePort service [LinuxOnly] [Conformance]",
		"[sig-network] Services should be able to switch session affinity for service with type clusterIP [LinuxOnly] [Conformance]",
		"[sig-network] Services should have session affinity work for NodePort service [LinuxOnly] [Conformance]",
		"[sig-network] Services should have session affinity work for service with type clusterIP [LinuxOnly] [Conformance]",
		"[sig-network] Services should serve a basic endpoint from pods [Conformance]",
		"[sig-network] Services should serve multiport endpoints from pods [Conformance]",
	}
	if !slices.Equal(skipped, want) {
		t.Errorf("the DNS rule skips\n  %s\nwant\n  %s", strings.Join(skipped, "\n  "), strings.Join(want, "\n  "))
	}
	if len(p.Run) != 47-16 {
		t.Errorf("%d left to run, want 31", len(p.Run))
	}
	// The other DNS specs need no DNS server and still run.
	for _, s := range p.Run {
		if strings.Contains(s.Name, "DNS") && strings.Contains(s.Name, "should provide DNS for") && !strings.Contains(s.Name, "Hostname") {
			t.Errorf("%s runs without DNS", s.Name)
		}
	}

	// Without the cluster domain, two more.
	p, err = p.Skip(SkipRule{Pattern: ClusterDomainPattern, Reason: "domain"})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Skipped) != 18 || len(p.Run) != 29 {
		t.Errorf("with the cluster domain rule: %d skipped, %d to run, want 18 and 29", len(p.Skipped), len(p.Run))
	}
	for _, s := range p.Skipped {
		if (s.Reason == "domain") != (strings.Contains(s.Name, "/etc/hosts") || strings.Contains(s.Name, "Hostname")) {
			t.Errorf("skipped %+v", s)
		}
	}

	// A focus inside the suite.
	c, err = Filter{Suite: Conformance, Focus: "session affinity"}.compile()
	if err != nil {
		t.Fatal(err)
	}
	if p := c.plan(r); len(p.Run) != 4 {
		t.Errorf("focus on session affinity: %d specs, want 4", len(p.Run))
	}
	if _, err := (Plan{}).Skip(SkipRule{Pattern: "("}); err == nil {
		t.Error("no error for an invalid rule")
	}
}

func TestParseLdd(t *testing.T) {
	out := []byte(`	linux-vdso.so.1 (0x00007ffd8a1f5000)
	libbsd.so.0 => /lib/x86_64-linux-gnu/libbsd.so.0 (0x00007f1c3c5e0000)
	libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f1c3c3ff000)
	/lib64/ld-linux-x86-64.so.2 (0x00007f1c3c62a000)
`)
	got, err := parseLdd(out)
	want := []string{"/lib/x86_64-linux-gnu/libbsd.so.0", "/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("parseLdd = %q, %v", got, err)
	}
	if _, err := parseLdd([]byte("\tlibfoo.so.1 => not found\n")); err == nil {
		t.Error("no error for a missing library")
	}
}

// TestPrivilegedToolFilesRun lays the conformance tools' files out as a root
// file system and runs each tool in it (chroot, root): the image's shell,
// nc, curl, dig... find their libraries without this machine's.
func TestPrivilegedToolFilesRun(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CELLIUM_REQUIRE_PRIVILEGED") == "1" {
			t.Fatal("needs root (chroot)")
		}
		t.Skip("needs root (chroot)")
	}
	files, err := ToolFiles(context.Background(), ConformanceTools)
	if err != nil {
		if os.Getenv("CELLIUM_REQUIRE_PRIVILEGED") == "1" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	root := t.TempDir()
	for _, f := range files {
		data := f.Data
		if f.Source != "" {
			if data, err = os.ReadFile(f.Source); err != nil {
				t.Fatal(err)
			}
		}
		p := filepath.Join(root, f.Path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, args := range [][]string{
		{"/bin/sh", "-c", "echo hostName | /usr/bin/nc -h 2>&1 | /usr/bin/head -1"},
		{"/usr/bin/curl", "--version"},
		{"/usr/bin/dig", "-v"},
		{"/usr/bin/wget", "--version"},
		{"/bin/sh", "-c", "for i in `seq 1 2`; do test -n \"$(getent hosts localhost || echo none)\" && echo OK; sleep 0; done | grep -c OK"},
		{"/usr/bin/awk", "BEGIN{print 1}"},
		{"/usr/bin/hostname"},
	} {
		cmd := exec.Command("chroot", append([]string{root}, args...)...)
		cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin"}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("%q in the image's files: %v: %s", args, err, out)
		}
	}
}
