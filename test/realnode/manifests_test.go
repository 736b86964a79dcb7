package realnode

import (
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/cellium/cellium/cells/kvstore"
	"github.com/cellium/cellium/cli"
	"github.com/cellium/cellium/install"
	"github.com/cellium/cellium/test/harness"
)

// TestManifestsRunInCelliumImage: every program the committed manifests
// run in cellium's image (containers, init containers, exec probes) is a
// file the packed image has (CelliumSpec: /usr/bin/<binary>), and none is a
// shell: the image has none. Every plugin install-cni-plugin copies
// (--from=) is in the image too (/usr/bin/cellium-cni, /usr/lib/cni/portmap).
func TestManifestsRunInCelliumImage(t *testing.T) {
	root, err := harness.RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	objs, err := install.ReadObjects(root)
	if err != nil {
		t.Fatal(err)
	}
	packed := map[string]bool{}
	for name := range CelliumSpec.Packages {
		packed["/usr/bin/"+name] = true
	}
	for _, p := range CelliumSpec.Prebuilt {
		packed["/usr/bin/"+p.Name] = true
	}
	plugins := map[string]bool{}
	for _, name := range harness.ImageCNIPlugins {
		plugins[CNIPluginDir+"/"+name] = true
	}
	installed := map[string]bool{}
	checked := 0
	check := func(where string, argv []string) {
		checked++
		if len(argv) == 0 {
			t.Errorf("%s: no command (the image's entrypoint would run)", where)
			return
		}
		if !packed[argv[0]] {
			t.Errorf("%s runs %s, which the cellium image does not have (it has %v)", where, argv[0], packed)
		}
		if base := path.Base(argv[0]); base == "sh" || base == "bash" || strings.HasPrefix(argv[0], "/bin/") {
			t.Errorf("%s runs a shell or /bin program (%s): the image has none", where, argv[0])
		}
		if len(argv) > 1 && argv[1] == "install-cni-plugin" {
			for _, a := range argv[2:] {
				if from, ok := strings.CutPrefix(a, "--from="); ok {
					installed[from] = true
					if !packed[from] && !plugins[from] {
						t.Errorf("%s installs %s, which the cellium image does not have", where, from)
					}
				}
			}
		}
	}
	for _, o := range objs {
		var spec *corev1.PodSpec
		switch o.GetKind() {
		case "DaemonSet":
			var ds appsv1.DaemonSet
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &ds); err != nil {
				t.Fatal(err)
			}
			spec = &ds.Spec.Template.Spec
			// The chart's default is Cilium's: the agent's own (none).
			for _, a := range ds.Spec.Template.Spec.Containers[0].Args {
				if strings.HasPrefix(a, "--cni-chaining-mode") {
					t.Errorf("default manifests pass %s; cni.chainingMode defaults to unset (the agent's none)", a)
				}
			}
		case "Deployment":
			var d appsv1.Deployment
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &d); err != nil {
				t.Fatal(err)
			}
			spec = &d.Spec.Template.Spec
		default:
			continue
		}
		for _, c := range append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...) {
			where := o.GetKind() + " " + o.GetName() + " container " + c.Name
			check(where, c.Command)
			for _, p := range []*corev1.Probe{c.ReadinessProbe, c.LivenessProbe, c.StartupProbe} {
				if p != nil && p.Exec != nil {
					check(where+" probe", p.Exec.Command)
				}
			}
		}
	}
	for p := range plugins {
		if !installed[p] {
			t.Errorf("the image carries %s but install-cni-plugin does not install it (installs %v)", p, installed)
		}
	}
	if !installed["/usr/bin/cellium-cni"] {
		t.Errorf("install-cni-plugin does not install /usr/bin/cellium-cni (installs %v)", installed)
	}
	if checked < 5 {
		t.Fatalf("checked %d commands; the manifests have at least 5 (2 init containers, 2 containers, probes)", checked)
	}
}

// renderChart renders the chart with helm (built into the cache if
// missing) and the values given (key=value, as --set), and parses the
// objects.
func renderChart(t *testing.T, values ...string) []*unstructured.Unstructured {
	t.Helper()
	helm, err := harness.EnsureHelm(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	root, err := harness.RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	out, err := install.RenderWith(t.Context(), helm, root, values...)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := install.Objects(out)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// TestDevValues renders the chart with DevValues for a node in a long
// directory, hubble-relay enabled as make up has it: the workloads run the
// packed images (cellium's, the relay's) without pulling, reach the
// API server on 127.0.0.1, and every host path of the agent lies in the
// node's directory; the shims' socket directory of such a node is short
// enough for containerd.
func TestDevValues(t *testing.T) {
	if testing.Short() {
		t.Skip("builds or runs helm")
	}
	n := &Node{Dir: "/work/some/long/checkout/.cellium-dev/node", host: hostState{LinkName: "crn0a0b"}}
	n.agentCfg.Dir = n.Dir + "/agent"
	if d := n.shimSocketDir(); len(d) > maxShimSocketDir || !strings.HasPrefix(d, "/run/cellium-crn0a0b") {
		t.Errorf("shim socket dir %s (%d bytes)", d, len(d))
	}
	objs := renderChart(t, append(DevValues(n, 6443, 9999, DefaultPodCIDR), "hubble.relay.enabled=true")...)
	workloads, relay := 0, false
	for _, o := range objs {
		var spec corev1.PodSpec
		switch o.GetKind() {
		case "DaemonSet":
			var ds appsv1.DaemonSet
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &ds); err != nil {
				t.Fatal(err)
			}
			spec = ds.Spec.Template.Spec
			// hostPort works on the dev node (the conformance spec).
			if !slices.Contains(spec.Containers[0].Args, "--cni-chaining-mode=portmap") {
				t.Errorf("agent args %v: want --cni-chaining-mode=portmap", spec.Containers[0].Args)
			}
			for _, v := range spec.Volumes {
				// The host's /proc is read only to enter its cgroup
				// namespace (mount-cgroup).
				if v.HostPath != nil && v.HostPath.Path != "/proc" && !strings.HasPrefix(v.HostPath.Path, n.Dir+"/") {
					t.Errorf("agent volume %s: host path %s outside the node's directory", v.Name, v.HostPath.Path)
				}
			}
		case "Deployment":
			var d appsv1.Deployment
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &d); err != nil {
				t.Fatal(err)
			}
			spec = d.Spec.Template.Spec
			if d.Name == RelayDeployment {
				// make up's relay: the locally packed upstream relay.
				if c := spec.Containers[0]; c.Image != HubbleRelayImage || c.ImagePullPolicy != corev1.PullNever {
					t.Errorf("relay image %s pull %s, want %s never pulled", c.Image, c.ImagePullPolicy, HubbleRelayImage)
				}
				relay = true
				continue
			}
			if *d.Spec.Replicas != 1 {
				t.Errorf("operator replicas %d, want 1 (one node)", *d.Spec.Replicas)
			}
		default:
			continue
		}
		workloads++
		for _, c := range append(spec.InitContainers, spec.Containers...) {
			if c.Image != CelliumImage || c.ImagePullPolicy != corev1.PullNever {
				t.Errorf("%s container %s: image %s pull %s, want %s never pulled", o.GetKind(), c.Name, c.Image, c.ImagePullPolicy, CelliumImage)
			}
		}
		env := map[string]string{}
		for _, e := range spec.Containers[0].Env {
			env[e.Name] = e.Value
		}
		if env["KUBERNETES_SERVICE_HOST"] != "127.0.0.1" || env["KUBERNETES_SERVICE_PORT"] != "6443" {
			t.Errorf("%s: API server env %v", o.GetKind(), env)
		}
		// The CLI in the agent's container finds the socket without -H
		// (kubectl exec ds/cellium-agent -- cellium status).
		if o.GetKind() == "DaemonSet" {
			sock := n.AgentConfig().SocketPath()
			if env[cli.SocketEnv] != sock || !slices.Contains(spec.Containers[0].Args, "--socket-path="+sock) {
				t.Errorf("agent: %s=%q, args %v: want both to be %s", cli.SocketEnv, env[cli.SocketEnv], spec.Containers[0].Args, sock)
			}
		}
	}
	if workloads != 2 || !relay {
		t.Fatalf("%d workloads and relay %v rendered, want the DaemonSet, the operator's Deployment and hubble-relay's", workloads, relay)
	}
}

// TestKVStoreValues renders the chart as a several-node cluster in kvstore
// mode installs it (ClusterValues, then KVStoreValues with the etcd on the
// nodes' bridge): agent and operator run in the node's network namespace
// (hostNetwork, where the bridge address is reachable) with kvstore
// identities and --kvstore=etcd, and read the etcd client file of the
// ConfigMap cilium-config (the non-root operator through its fsGroup),
// which names the one endpoint given (not the chart's placeholder) and
// which the agent's kvstore options accept. Agent and operator have the same
// --cluster-name (the operator's kvstore nodes GC collects that cluster's
// node keys).
func TestKVStoreValues(t *testing.T) {
	if testing.Short() {
		t.Skip("builds or runs helm")
	}
	etcdURL := "http://" + BridgeAddr.String() + ":23790"
	objs := renderChart(t, append(ClusterValues(BridgeAddr.String(), 6443, 9999, DefaultPodCIDR), KVStoreValues(etcdURL)...)...)
	var file string
	specs := map[string]*corev1.PodSpec{}
	for _, o := range objs {
		switch {
		case o.GetKind() == "ConfigMap" && o.GetName() == "cilium-config":
			var cm corev1.ConfigMap
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &cm); err != nil {
				t.Fatal(err)
			}
			file = cm.Data["etcd-config"]
		case o.GetKind() == "DaemonSet" && o.GetName() == AgentDaemonSet:
			var ds appsv1.DaemonSet
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &ds); err != nil {
				t.Fatal(err)
			}
			specs["agent"] = &ds.Spec.Template.Spec
		case o.GetKind() == "Deployment" && o.GetName() == OperatorDeployment:
			var d appsv1.Deployment
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &d); err != nil {
				t.Fatal(err)
			}
			specs["operator"] = &d.Spec.Template.Spec
		}
	}
	if len(specs) != 2 {
		t.Fatalf("rendered %d of the agent's DaemonSet and the operator's Deployment", len(specs))
	}
	for name, spec := range specs {
		if !spec.HostNetwork {
			t.Errorf("%s is not in the node's network namespace: it would not reach etcd at %s", name, etcdURL)
		}
		c := spec.Containers[0]
		for _, want := range []string{"--identity-allocation-mode=kvstore", "--kvstore=etcd", "--kvstore-opt=etcd.config=/var/lib/etcd-config/etcd.config"} {
			if !slices.Contains(c.Args, want) {
				t.Errorf("%s args lack %s: %v", name, want, c.Args)
			}
		}
		mounted := false
		for _, m := range c.VolumeMounts {
			for _, v := range spec.Volumes {
				if m.Name == v.Name && m.MountPath == "/var/lib/etcd-config" && v.ConfigMap != nil && v.ConfigMap.Name == "cilium-config" &&
					len(v.ConfigMap.Items) == 1 && v.ConfigMap.Items[0].Key == "etcd-config" && v.ConfigMap.Items[0].Path == "etcd.config" {
					mounted = true
				}
			}
		}
		if !mounted {
			t.Errorf("%s does not mount cilium-config's etcd-config at /var/lib/etcd-config/etcd.config", name)
		}
		// The non-root operator reads the 0400 file through its group.
		if sc := c.SecurityContext; name == "operator" && sc != nil && sc.RunAsUser != nil && *sc.RunAsUser != 0 {
			if psc := spec.SecurityContext; psc == nil || psc.FSGroup == nil || sc.RunAsGroup == nil || *psc.FSGroup != *sc.RunAsGroup {
				t.Errorf("the operator runs as user %d without its group as fsGroup: it cannot read etcd.config", *sc.RunAsUser)
			}
		}
	}
	// The operator's kvstore nodes GC collects the agents' cluster's keys.
	clusterName := func(name string) string {
		for _, a := range specs[name].Containers[0].Args {
			if v, ok := strings.CutPrefix(a, "--cluster-name="); ok {
				return v
			}
		}
		return ""
	}
	if a, o := clusterName("agent"), clusterName("operator"); a == "" || a != o {
		t.Errorf("agent --cluster-name=%q, operator --cluster-name=%q: want the same", a, o)
	}
	if file == "" {
		t.Fatal("no etcd-config in a ConfigMap cilium-config")
	}
	path := filepath.Join(t.TempDir(), "etcd.config")
	if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := kvstore.EtcdConfig(map[string]string{kvstore.OptConfig: path})
	if err != nil {
		t.Fatalf("the agent refuses the rendered etcd-config:\n%s\n%v", file, err)
	}
	if !slices.Equal(cfg.Endpoints, []string{etcdURL}) || cfg.TLS != nil {
		t.Errorf("etcd-config endpoints %v (TLS %v), want only %s over plain http:\n%s", cfg.Endpoints, cfg.TLS != nil, etcdURL, file)
	}
}
