package realnode

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/cellium/cellium/test/harness"
)

// TestNodeBinaryVersions: the cached node binaries report the versions
// pinned in tools/k8s, tools/containerd and tools/coredns (stamped with
// -ldflags, as their upstream builds do), and containerd and CoreDNS are
// static (built without cgo).
func TestNodeBinaryVersions(t *testing.T) {
	bins, missing, err := harness.CachedNodeBinaries()
	if err != nil {
		t.Fatal(err)
	}
	if len(missing) > 0 {
		t.Skipf("node binaries not built (%s): run make node-binaries", strings.Join(missing, ", "))
	}
	for _, c := range []struct {
		path, arg, want string
	}{
		{bins.Kubelet, "--version", "Kubernetes " + bins.KubernetesVersion},
		{bins.KubeScheduler, "--version", "Kubernetes " + bins.KubernetesVersion},
		{bins.KubeProxy, "--version", "Kubernetes " + bins.KubernetesVersion},
		{bins.Containerd, "--version", " " + bins.ContainerdVersion},
		{bins.Ctr, "--version", " " + bins.ContainerdVersion},
		{bins.ContainerdShim, "-v", "Version:  " + bins.ContainerdVersion},
		// CoreDNS-1.15.0 and the stamp (upstream's is the commit).
		{bins.CoreDNS, "-version", "CoreDNS-" + strings.TrimPrefix(bins.CoreDNSVersion, "v")},
		{bins.CoreDNS, "-version", bins.CoreDNSVersion},
	} {
		out, err := exec.Command(c.path, c.arg).CombinedOutput()
		if err != nil || !strings.Contains(string(out), c.want) {
			t.Errorf("%s %s: %q, %v; want it to contain %q", c.path, c.arg, out, err, c.want)
		}
	}
	// The build settings recorded in the binary.
	info, err := exec.Command("go", "version", "-m", bins.Containerd).CombinedOutput()
	if err != nil || !strings.Contains(string(info), "CGO_ENABLED=0") || !strings.Contains(string(info), "no_btrfs") {
		t.Errorf("containerd build settings (%v): want CGO_ENABLED=0 and the no_btrfs tag:\n%s", err, info)
	}
	if info, err := exec.Command("go", "version", "-m", bins.CoreDNS).CombinedOutput(); err != nil || !strings.Contains(string(info), "CGO_ENABLED=0") {
		t.Errorf("CoreDNS build settings (%v): want CGO_ENABLED=0:\n%s", err, info)
	}
}
