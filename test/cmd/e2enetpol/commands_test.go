package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/cellium/cellium/test/harness"
)

// TestMakefileFlags: every flag the Makefile's e2e targets pass to
// e2enetpol exists on the subcommand they call.
func TestMakefileFlags(t *testing.T) {
	root, err := harness.RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	line := regexp.MustCompile(`(?m) run \./test/cmd/e2enetpol (\w+)(.*)$`)
	flag := regexp.MustCompile(`--([a-z-]+)`)
	calls := line.FindAllStringSubmatch(string(mk), -1)
	if len(calls) < 3 {
		t.Fatalf("the Makefile calls e2enetpol %d times, want build, run and run --realnode", len(calls))
	}
	for _, c := range calls {
		cmd, _, err := newRootCmd().Find([]string{c[1]})
		if err != nil || cmd.Name() != c[1] {
			t.Errorf("make calls e2enetpol %s: %v", c[1], err)
			continue
		}
		for _, f := range flag.FindAllStringSubmatch(c[2], -1) {
			if cmd.Flags().Lookup(f[1]) == nil {
				t.Errorf("make passes --%s to e2enetpol %s, which has no such flag", f[1], c[1])
			}
		}
	}
}

// TestRunDefaults: run reaches `make up`'s cluster by default.
func TestRunDefaults(t *testing.T) {
	cmd, _, err := newRootCmd().Find([]string{"run"})
	if err != nil {
		t.Fatal(err)
	}
	if got := cmd.Flags().Lookup("kubeconfig").DefValue; got != ".cellium-dev/kubeconfig" {
		t.Errorf("default kubeconfig %s", got)
	}
	if got := cmd.Flags().Lookup("spec-timeout").DefValue; !strings.HasPrefix(got, "5m") {
		t.Errorf("default spec timeout %s", got)
	}
}
