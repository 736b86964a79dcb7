package harness

import (
	"strings"
	"testing"
)

func TestPlanHelmLayout(t *testing.T) {
	t.Setenv("CELLIUM_CACHE_DIR", "/x/cache")
	b, err := planHelm()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(b.version, "v3.") {
		t.Errorf("helm version %q, want v3.x from tools/helm/go.mod", b.version)
	}
	if want := "/x/cache/bin/helm-" + b.version; b.outDir != want {
		t.Errorf("outDir %s, want %s", b.outDir, want)
	}
	if len(b.programs) != 1 || b.programs[0].name != "helm" || b.programs[0].pkg != "helm.sh/helm/v3/cmd/helm" {
		t.Errorf("programs %+v, want helm from helm.sh/helm/v3/cmd/helm", b.programs)
	}
}

func TestHelmLdflags(t *testing.T) {
	got := helmLdflags("v3.22.0", "v0.37.0")
	for _, want := range []string{
		"-X helm.sh/helm/v3/internal/version.version=v3.22.0",
		"-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1",
		"-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=37",
		"-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=37",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("helmLdflags = %q, missing %q", got, want)
		}
	}
}
