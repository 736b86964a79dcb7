package realnode

import (
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestContainerdConfig: the rendered configuration carries what this
// machine needs (restrict_oom_score_adj, the sandbox image, the CNI
// directories) and keeps every path of containerd, its shims and runc in
// the node's directory.
func TestContainerdConfig(t *testing.T) {
	text, err := containerdConfig{
		Root: "/n/c/root", State: "/n/c/state", Temp: "/n/c/tmp", Socket: "/n/containerd.sock",
		ShimSocketDir: "/n/c/s", RuncRoot: "/n/c/runc", Runc: "/usr/sbin/runc",
		CNIBinDir: "/n/cni-bin", CNIConfDir: "/n/agent/net.d", SandboxImage: SandboxImage,
	}.render()
	if err != nil {
		t.Fatal(err)
	}
	s := string(text)
	for _, want := range []string{
		"version = 4",
		`root = "/n/c/root"`,
		`state = "/n/c/state"`,
		"imports = []",
		`address = "/n/containerd.sock"`,
		`address = "/n/containerd.sock.ttrpc"`,
		`socket_dir = "/n/c/s"`,
		"restrict_oom_score_adj = true",
		"netns_mounts_under_state_dir = true",
		`sandbox = "registry.k8s.io/pause:3.10.2"`,
		`bin_dirs = ["/n/cni-bin"]`,
		`conf_dir = "/n/agent/net.d"`,
		`BinaryName = "/usr/sbin/runc"`,
		`Root = "/n/c/runc"`,
		"SystemdCgroup = false",
		"disable = true", // NRI
	} {
		if !strings.Contains(s, want) {
			t.Errorf("containerd configuration lacks %s:\n%s", want, s)
		}
	}
	for line := range strings.Lines(s) {
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		if strings.Contains(line, "/run/") || strings.Contains(line, "/var/") || strings.Contains(line, "/etc/") || strings.Contains(line, "/opt/") {
			t.Errorf("host path outside the node's directory: %s", line)
		}
	}
}

// TestKubeletConfig: the rendered KubeletConfiguration parses as YAML and
// sets what this machine needs (cgroupfs on cgroup v1, the node's cgroup
// root and pod logs, the runtime socket) and locks the kubelet's API to
// certificates of the cluster CA.
func TestKubeletConfig(t *testing.T) {
	text, err := kubeletConfig{
		RuntimeSocket: "/n/containerd.sock", CgroupRoot: "/cellium-rn-10-254-1-2", PodLogsDir: "/n/pod-logs",
		NodeIP: "10.254.1.2", Port: 10250, HealthzPort: 10248, ClientCAFile: "/c/pki/ca.crt",
	}.render()
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := yaml.Unmarshal(text, &cfg); err != nil {
		t.Fatalf("kubelet configuration is not YAML: %v\n%s", err, text)
	}
	for key, want := range map[string]any{
		"kind":                     "KubeletConfiguration",
		"cgroupDriver":             "cgroupfs",
		"failCgroupV1":             false,
		"cgroupRoot":               "/cellium-rn-10-254-1-2",
		"containerRuntimeEndpoint": "unix:///n/containerd.sock",
		"podLogsDir":               "/n/pod-logs",
		"address":                  "10.254.1.2",
		"port":                     float64(10250),
		"readOnlyPort":             float64(0),
	} {
		if cfg[key] != want {
			t.Errorf("%s = %v, want %v", key, cfg[key], want)
		}
	}
	authn, _ := cfg["authentication"].(map[string]any)
	anon, _ := authn["anonymous"].(map[string]any)
	x509, _ := authn["x509"].(map[string]any)
	if anon["enabled"] != false || x509["clientCAFile"] != "/c/pki/ca.crt" {
		t.Errorf("authentication %v", authn)
	}
	if _, ok := cfg["clusterDNS"]; ok {
		t.Errorf("clusterDNS %v without a cluster DNS", cfg["clusterDNS"])
	}

	// With the cluster DNS: the pods' nameserver and search domain.
	text, err = kubeletConfig{RuntimeSocket: "/s", NodeIP: "10.254.1.2", ClusterDNS: "10.237.0.10", ClusterDomain: "cluster.local"}.render()
	if err != nil {
		t.Fatal(err)
	}
	cfg = nil
	if err := yaml.Unmarshal(text, &cfg); err != nil {
		t.Fatalf("kubelet configuration is not YAML: %v\n%s", err, text)
	}
	if dns, _ := cfg["clusterDNS"].([]any); len(dns) != 1 || dns[0] != "10.237.0.10" || cfg["clusterDomain"] != "cluster.local" {
		t.Errorf("clusterDNS %v, clusterDomain %v", cfg["clusterDNS"], cfg["clusterDomain"])
	}
}

func TestUnescapeMount(t *testing.T) {
	for in, want := range map[string]string{
		`/tmp/a`:          "/tmp/a",
		`/tmp/a\040b`:     "/tmp/a b",
		`/tmp/x\134y\011`: "/tmp/x\\y\t",
	} {
		if got := unescapeMount(in); got != want {
			t.Errorf("unescapeMount(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestKubeProxyConfig: nftables mode, the node's name and credentials,
// health and metrics on loopback, conntrack sysctls left alone.
func TestKubeProxyConfig(t *testing.T) {
	text, err := kubeProxyConfig{Kubeconfig: "/c/kubeconfig-kube-proxy", NodeName: "10.254.1.2", ClusterCIDR: "10.231.0.0/16", HealthzPort: 1, MetricsPort: 2}.render()
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Kind             string `json:"kind"`
		Mode             string `json:"mode"`
		HostnameOverride string `json:"hostnameOverride"`
		ClusterCIDR      string `json:"clusterCIDR"`
		Healthz          string `json:"healthzBindAddress"`
		Metrics          string `json:"metricsBindAddress"`
		ClientConnection struct {
			Kubeconfig string `json:"kubeconfig"`
		} `json:"clientConnection"`
		Conntrack struct {
			MaxPerCore *int `json:"maxPerCore"`
		} `json:"conntrack"`
	}
	if err := yaml.Unmarshal(text, &cfg); err != nil {
		t.Fatalf("not YAML: %v\n%s", err, text)
	}
	if cfg.Kind != "KubeProxyConfiguration" || cfg.Mode != "nftables" || cfg.HostnameOverride != "10.254.1.2" ||
		cfg.ClusterCIDR != "10.231.0.0/16" || cfg.Healthz != "127.0.0.1:1" || cfg.Metrics != "127.0.0.1:2" ||
		cfg.ClientConnection.Kubeconfig != "/c/kubeconfig-kube-proxy" || cfg.Conntrack.MaxPerCore == nil || *cfg.Conntrack.MaxPerCore != 0 {
		t.Errorf("kube-proxy configuration %+v\n%s", cfg, text)
	}
}

// TestIsNodeResult: libcni's cached results of the node's networks are
// recognised, the chained conflist's ("portmap", cni.chainingMode=portmap)
// included, and nothing else (make down once left
// /var/lib/cni/results/portmap-<id>-eth0 behind and failed).
func TestIsNodeResult(t *testing.T) {
	id := strings.Repeat("0123456789abcdef", 4)
	for name, want := range map[string]bool{
		"cellium-" + id + "-eth0":                  true,
		"portmap-" + id + "-eth0":                  true,
		"cni-loopback-" + id + "-lo":               true,
		"portmap-" + id[:12] + "-eth0":             false, // not a container ID
		"portmap-" + id + "-":                      false,
		"bridge-" + id + "-eth0":                   false, // another CNI's network
		"portmap":                                  false,
		"cellium-" + strings.ToUpper(id) + "-eth0": false,
	} {
		if got := isNodeResult(name); got != want {
			t.Errorf("isNodeResult(%q) = %v, want %v", name, got, want)
		}
	}
}

// TestTopMissing: the topmost missing directory of a path is what a node
// made (and removes), not only the leaf.
func TestTopMissing(t *testing.T) {
	dir := t.TempDir()
	if got := topMissing(dir + "/a/b/c"); got != dir+"/a" {
		t.Errorf("topMissing = %q, want %s/a", got, dir)
	}
	if got := topMissing(dir); got != "" {
		t.Errorf("topMissing(existing) = %q", got)
	}
}

// TestNodeIPAt: node i has 10.250.0.i on the nodes' bridge network, for 1
// to MaxNodes nodes.
func TestNodeIPAt(t *testing.T) {
	for i := 1; i <= MaxNodes; i++ {
		ip, err := NodeIPAt(i)
		if err != nil || !NodeNetwork.Contains(ip) || ip.As4()[3] != byte(i) || ip == BridgeAddr {
			t.Errorf("NodeIPAt(%d) = %s, %v", i, ip, err)
		}
	}
	for _, i := range []int{0, MaxNodes + 1} {
		if _, err := NodeIPAt(i); err == nil {
			t.Errorf("NodeIPAt(%d): no error", i)
		}
		if err := CheckNodeCount(i); err == nil {
			t.Errorf("CheckNodeCount(%d): no error", i)
		}
	}
	if err := CheckNodeCount(1); err != nil {
		t.Error(err)
	}
}
