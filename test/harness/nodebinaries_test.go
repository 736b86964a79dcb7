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

func TestPlanNodeBinariesLayout(t *testing.T) {
	t.Setenv("CELLIUM_CACHE_DIR", "/x/cache")
	plan, bins, err := planNodeBinaries()
	if err != nil {
		t.Fatal(err)
	}
	k8s := "/x/cache/bin/k8s-" + bins.KubernetesVersion + "/"
	ctrd := "/x/cache/bin/containerd-" + bins.ContainerdVersion + "/"
	for got, want := range map[string]string{
		bins.Kubelet:        k8s + "kubelet",
		bins.KubeScheduler:  k8s + "kube-scheduler",
		bins.KubeProxy:      k8s + "kube-proxy",
		bins.Containerd:     ctrd + "containerd",
		bins.Ctr:            ctrd + "ctr",
		bins.ContainerdShim: ctrd + "containerd-shim-runc-v2",
		bins.Loopback:       "/x/cache/bin/cni-plugins-" + bins.CNIPluginsVersion + "/loopback",
	} {
		if got != want {
			t.Errorf("binary at %s, want %s", got, want)
		}
	}
	if !strings.HasPrefix(bins.ContainerdVersion, "v2.") || !strings.HasPrefix(bins.KubernetesVersion, "v1.") {
		t.Errorf("versions %+v", bins)
	}
	// The node's Kubernetes binaries share the control plane's directory
	// but not its recipe: building one group never invalidates the other.
	_, cp, err := planBinaries()
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Dir(cp.KubeAPIServer) != filepath.Dir(bins.Kubelet) {
		t.Errorf("kubelet in %s, kube-apiserver in %s", bins.Kubelet, cp.KubeAPIServer)
	}
	kb := plan[NodeGroupKubernetes][0]
	if kb.recipePath() == filepath.Join(kb.outDir, recipeFile) {
		t.Errorf("node binaries use the control plane's recipe file %s", kb.recipePath())
	}
	cb := plan[NodeGroupContainerd][0]
	if cb.tags != "no_btrfs no_devmapper no_zfs" || len(cb.env) != 1 || cb.env[0] != "CGO_ENABLED=0" {
		t.Errorf("containerd build tags %q env %v", cb.tags, cb.env)
	}
	if !strings.Contains(cb.ldflags, "containerd/v2/version.Version="+bins.ContainerdVersion) {
		t.Errorf("containerd ldflags %q lack the version", cb.ldflags)
	}
	db := plan[NodeGroupCoreDNS][0]
	if len(db.env) != 1 || db.env[0] != "CGO_ENABLED=0" || !strings.Contains(db.ldflags, "coremain.GitCommit="+bins.CoreDNSVersion) ||
		filepath.Base(db.outDir) != "coredns-"+bins.CoreDNSVersion || bins.CoreDNS != filepath.Join(db.outDir, "coredns") {
		t.Errorf("CoreDNS build: env %v, ldflags %q, into %s; binary %s", db.env, db.ldflags, db.outDir, bins.CoreDNS)
	}
	if !strings.Contains(db.recipe(), "# sources ") {
		t.Errorf("CoreDNS's recipe %q lacks the hash of its main.go", db.recipe())
	}
	if !strings.HasPrefix(bins.CoreDNSVersion, "v1.") {
		t.Errorf("CoreDNS version %q", bins.CoreDNSVersion)
	}
	if _, err := EnsureNodeBinaries(context.Background(), nil, "nonsense"); err == nil {
		t.Error("EnsureNodeBinaries accepted an unknown group")
	}
}

// TestControlPlaneRecipeUnchanged: the recipe of the control-plane build is
// the text that caches made before tags and env existed hold, so those
// cached binaries stay valid.
func TestControlPlaneRecipeUnchanged(t *testing.T) {
	b := toolBuild{ldflags: "-X a.b=c", programs: []program{{pkg: "x/y"}, {pkg: "x/z"}}}
	if got, want := b.recipe(), "go build -trimpath -ldflags=\"-X a.b=c\" x/y x/z\n"; got != want {
		t.Errorf("recipe %q, want %q", got, want)
	}
}

// TestToolBuildTagsEnvRecipe builds a module whose output depends on a build
// tag and on CGO_ENABLED, twice into one directory under two recipe files:
// the tag and the environment reach the compiler, and a second group with
// its own recipe leaves the first one's binary alone.
func TestToolBuildTagsEnvRecipe(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command")
	}
	mod := t.TempDir()
	writeFile(t, filepath.Join(mod, "go.mod"), "module example.com/tagged\n\ngo 1.22\n")
	for _, dir := range []string{"plain", "special"} { // go build names each binary after its directory
		d := filepath.Join(mod, dir)
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(d, "main.go"), "package main\n\nfunc main() { println(word) }\n")
		writeFile(t, filepath.Join(d, "on.go"), "//go:build special\n\npackage main\n\nconst word = \"special\"\n")
		writeFile(t, filepath.Join(d, "off.go"), "//go:build !special\n\npackage main\n\nconst word = \"plain\"\n")
		writeFile(t, filepath.Join(d, "cgo.go"), "//go:build cgo\n\npackage main\n\nfunc init() { println(\"cgo\") }\n")
	}
	out := filepath.Join(t.TempDir(), "bin", "tagged-v1")
	plain := toolBuild{moduleDir: mod, version: "v1", outDir: out, programs: []program{{name: "plain", pkg: "./plain"}}}
	special := toolBuild{moduleDir: mod, version: "v1", outDir: out, tags: "special", env: []string{"CGO_ENABLED=0"},
		recipeName: ".recipe-special", programs: []program{{name: "special", pkg: "./special"}}}
	log := slog.New(slog.DiscardHandler)
	for _, b := range []toolBuild{plain, special} {
		if err := b.ensure(context.Background(), log); err != nil {
			t.Fatal(err)
		}
	}
	// CGO_ENABLED=0 leaves cgo.go out: no "cgo" line.
	got, err := exec.Command(filepath.Join(out, "special")).CombinedOutput()
	if err != nil || strings.TrimSpace(string(got)) != "special" {
		t.Errorf("special: %q, %v; want \"special\" alone", got, err)
	}
	got, err = exec.Command(filepath.Join(out, "plain")).CombinedOutput()
	if err != nil || !strings.Contains(string(got), "plain") {
		t.Errorf("plain: %q, %v", got, err)
	}
	if len(plain.missing()) != 0 || len(special.missing()) != 0 {
		t.Errorf("missing after both builds: %v %v", plain.missing(), special.missing())
	}
	recipe, err := os.ReadFile(filepath.Join(out, ".recipe-special"))
	if err != nil || !strings.HasPrefix(string(recipe), "CGO_ENABLED=0 go build -trimpath -tags=\"special\"") {
		t.Errorf("recipe %q, %v", recipe, err)
	}
}
