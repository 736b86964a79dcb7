package install_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/cellium/cellium/install"
	"github.com/cellium/cellium/test/harness"
)

// helm returns the helm command, building it the first time (a few
// minutes cold); -short skips the tests that need it.
func helm(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("needs helm, which the harness builds from the Go module proxy; skipped with -short")
	}
	p, err := harness.EnsureHelm(t.Context(), slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := harness.RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// TestHelmLint runs `helm lint --strict` on the chart.
func TestHelmLint(t *testing.T) {
	h := helm(t)
	cmd := exec.CommandContext(t.Context(), h, "lint", "--strict", "--namespace", install.Namespace,
		filepath.Join(repoRoot(t), install.ChartDir))
	cmd.Env = append(os.Environ(), install.HelmEnv(t.TempDir())...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helm lint: %v\n%s", err, out)
	}
	if !bytes.Contains(out, []byte("0 chart(s) failed")) {
		t.Fatalf("helm lint did not report success:\n%s", out)
	}
}

// TestManifestsAreFresh renders the chart and fails if the committed plain
// manifests differ: after changing the chart, run `make manifests`.
func TestManifestsAreFresh(t *testing.T) {
	h := helm(t)
	root := repoRoot(t)
	got, err := install.Render(t.Context(), h, root)
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(filepath.Join(root, install.ManifestsFile))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s is stale: run `make manifests` and commit the result (%s)", install.ManifestsFile, firstDiff(want, got))
	}
}

func firstDiff(a, b []byte) string {
	al, bl := strings.Split(string(a), "\n"), strings.Split(string(b), "\n")
	for i := range max(len(al), len(bl)) {
		var x, y string
		if i < len(al) {
			x = al[i]
		}
		if i < len(bl) {
			y = bl[i]
		}
		if x != y {
			return fmt.Sprintf("line %d: committed %q, rendered %q", i+1, x, y)
		}
	}
	return "same lines"
}

// TestManifestsContents checks the committed manifests without a cluster:
// the kinds and names the harness relies on, in one namespace, and no
// wildcard anywhere in the RBAC rules.
func TestManifestsContents(t *testing.T) {
	objs, err := install.ReadObjects(repoRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, o := range objs {
		got = append(got, o.GetKind()+"/"+o.GetName())
		if ns := o.GetNamespace(); ns != "" && ns != install.Namespace {
			t.Errorf("%s %s in namespace %s, want %s", o.GetKind(), o.GetName(), ns, install.Namespace)
		}
		switch o.GetKind() {
		case "ClusterRole", "Role":
			var r rbacv1.ClusterRole
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &r); err != nil {
				t.Fatal(err)
			}
			for _, rule := range r.Rules {
				for _, l := range [][]string{rule.APIGroups, rule.Resources, rule.Verbs, rule.ResourceNames} {
					if slices.Contains(l, "*") {
						t.Errorf("%s %s: a wildcard in rule %+v", o.GetKind(), o.GetName(), rule)
					}
				}
				if len(rule.NonResourceURLs) > 0 {
					t.Errorf("%s %s: non-resource URLs %v (discovery is granted to every user already)", o.GetKind(), o.GetName(), rule.NonResourceURLs)
				}
			}
		}
	}
	slices.Sort(got)
	want := []string{
		"ClusterRole/" + install.AgentServiceAccount, "ClusterRole/" + install.OperatorServiceAccount,
		"ClusterRoleBinding/" + install.AgentServiceAccount, "ClusterRoleBinding/" + install.OperatorServiceAccount,
		"DaemonSet/cellium-agent", "Deployment/cellium-operator",
		"Role/" + install.OperatorServiceAccount, "RoleBinding/" + install.OperatorServiceAccount,
		"ServiceAccount/" + install.AgentServiceAccount, "ServiceAccount/" + install.OperatorServiceAccount,
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("objects %v, want %v", got, want)
	}
}

// TestManifestsApply applies the committed manifests to a real API server:
// the ServiceAccounts and RBAC objects for real, the DaemonSet and the
// Deployment as a server-side dry run (validation and admission, no
// kubelet to run them). Applying twice shows it is idempotent.
func TestManifestsApply(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and kube-apiserver; skipped with -short")
	}
	ctx := t.Context()
	c, err := harness.Start(ctx, harness.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
	}()
	for range 2 {
		if err := c.ApplyManifests(ctx, true); err != nil {
			t.Fatal(err)
		}
	}
	cs := c.Clientset()
	if _, err := cs.RbacV1().ClusterRoles().Get(ctx, install.AgentServiceAccount, metaGet); err != nil {
		t.Errorf("agent ClusterRole not applied: %v", err)
	}
	if _, err := cs.RbacV1().RoleBindings(install.Namespace).Get(ctx, install.OperatorServiceAccount, metaGet); err != nil {
		t.Errorf("operator RoleBinding not applied: %v", err)
	}
	// The workloads were a dry run only.
	if _, err := cs.AppsV1().DaemonSets(install.Namespace).Get(ctx, "cellium-agent", metaGet); err == nil {
		t.Error("the DaemonSet exists: the workloads must be applied as a dry run")
	}
	// The ServiceAccounts authenticate: a token of each works.
	for _, kc := range []func(context.Context) (string, error){c.AgentKubeconfig, c.OperatorKubeconfig} {
		if _, err := kc(ctx); err != nil {
			t.Error(err)
		}
	}
}

var metaGet = metav1.GetOptions{}
