package harness

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestPlanE2EBinariesLayout(t *testing.T) {
	t.Setenv("CELLIUM_CACHE_DIR", "/x/cache")
	builds, bins, err := planE2EBinaries()
	if err != nil {
		t.Fatal(err)
	}
	k8s := "/x/cache/bin/k8s-" + bins.KubernetesVersion + "/"
	if bins.E2ETest != k8s+"e2e.test" || bins.Agnhost != k8s+"agnhost" {
		t.Errorf("binaries %+v, want them in %s", bins, k8s)
	}
	if !strings.Contains(bins.KubernetesSource, "k8s.io/kubernetes@"+bins.KubernetesVersion) {
		t.Errorf("Kubernetes sources in %s, want the module cache's k8s.io/kubernetes@%s", bins.KubernetesSource, bins.KubernetesVersion)
	}
	if !strings.HasPrefix(bins.AgnhostVersion, "2.") {
		t.Errorf("agnhost version %q", bins.AgnhostVersion)
	}
	// They share the control plane's and the node's directory, not their
	// recipes: building them invalidates neither.
	_, cp, err := planBinaries()
	if err != nil {
		t.Fatal(err)
	}
	node, _, err := planNodeBinaries()
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Dir(cp.KubeAPIServer) != filepath.Dir(bins.E2ETest) {
		t.Errorf("e2e.test in %s, kube-apiserver in %s", bins.E2ETest, cp.KubeAPIServer)
	}
	if len(builds) != 2 {
		t.Fatalf("%d builds, want agnhost's and e2e.test's", len(builds))
	}
	for _, b := range builds {
		for _, other := range []string{filepath.Join(b.outDir, recipeFile), node[NodeGroupKubernetes][0].recipePath()} {
			if b.recipePath() == other {
				t.Errorf("e2e binaries share the recipe file %s", other)
			}
		}
	}
	if builds[0].recipePath() == builds[1].recipePath() {
		t.Errorf("agnhost and e2e.test share the recipe file %s", builds[0].recipePath())
	}
	for i, wants := range [][]string{
		{"CGO_ENABLED=0 go build -trimpath -ldflags=\"-X main.Version=" + bins.AgnhostVersion + "\" k8s.io/kubernetes/test/images/agnhost\n"},
		{"CGO_ENABLED=0 go test -c -vet=off -trimpath -ldflags=", "k8s.io/kubernetes/test/e2e\n",
			"k8s.io/component-base/version.gitVersion=" + bins.KubernetesVersion},
	} {
		recipe := builds[i].recipe()
		for _, want := range wants {
			if !strings.Contains(recipe, want) {
				t.Errorf("recipe %q lacks %q", recipe, want)
			}
		}
	}
}

// TestToolBuildTestBinary builds a command and a package's test binary in
// one toolBuild: the test binary runs the package's tests, with the
// ldflags applied.
func TestToolBuildTestBinary(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command")
	}
	mod := t.TempDir()
	writeFile(t, filepath.Join(mod, "go.mod"), "module example.com/suite\n\ngo 1.22\n")
	for _, dir := range []string{"cmd", "suite"} {
		if err := os.Mkdir(filepath.Join(mod, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, filepath.Join(mod, "cmd", "main.go"), "package main\n\nfunc main() { println(\"command\") }\n")
	writeFile(t, filepath.Join(mod, "suite", "suite.go"), "package suite\n\nvar Version = \"unset\"\n")
	writeFile(t, filepath.Join(mod, "suite", "suite_test.go"), "package suite\n\nimport \"testing\"\n\n"+
		"func TestVersion(t *testing.T) { t.Log(\"version\", Version) }\n")
	out := filepath.Join(t.TempDir(), "bin", "suite-v1")
	b := toolBuild{moduleDir: mod, version: "v1", outDir: out, ldflags: "-X example.com/suite/suite.Version=v1",
		env: []string{"CGO_ENABLED=0"}, recipeName: ".recipe-e2e", programs: []program{
			{name: "cmd", pkg: "./cmd"},
			{name: "suite.test", pkg: "./suite", test: true},
		}}
	if err := b.ensure(context.Background(), slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	got, err := exec.Command(filepath.Join(out, "suite.test"), "-test.v").CombinedOutput()
	if err != nil || !strings.Contains(string(got), "version v1") || !strings.Contains(string(got), "--- PASS: TestVersion") {
		t.Errorf("suite.test: %q, %v", got, err)
	}
	if got, err := exec.Command(filepath.Join(out, "cmd")).CombinedOutput(); err != nil || !strings.Contains(string(got), "command") {
		t.Errorf("cmd: %q, %v", got, err)
	}
	if m := b.missing(); len(m) != 0 {
		t.Errorf("missing after the build: %v", m)
	}
	recipe, err := os.ReadFile(filepath.Join(out, ".recipe-e2e"))
	if err != nil || !strings.Contains(string(recipe), "go test -c -vet=off -trimpath") {
		t.Errorf("recipe %q, %v", recipe, err)
	}
}
