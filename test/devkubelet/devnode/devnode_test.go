package devnode

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestNodeIP(t *testing.T) {
	seen := map[string]string{}
	for _, name := range []string{"a", "b", "cellium-node", "bench-node", "e2e-testprivilegedpodsendtoend"} {
		ip := NodeIP(name)
		if !ip.Is4() || ip.As4()[0] != 127 || ip.String() == "127.0.0.1" || ip.As4()[3] == 0 || ip.As4()[3] == 255 {
			t.Errorf("NodeIP(%q) = %s: want a 127.0.0.0/8 host address other than 127.0.0.1", name, ip)
		}
		if other, ok := seen[ip.String()]; ok {
			t.Errorf("NodeIP(%q) = NodeIP(%q) = %s", name, other, ip)
		}
		seen[ip.String()] = name
		if NodeIP(name) != ip {
			t.Errorf("NodeIP(%q) is not stable", name)
		}
	}
}

func TestFindBinaries(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, Agent), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := FindBinaries(dir, Agent)
	if err != nil || b.Agent != filepath.Join(dir, Agent) {
		t.Fatalf("FindBinaries(agent) = %+v, %v", b, err)
	}
	_, err = FindBinaries(dir, Agent, Operator, CNIPlugin)
	if err == nil || !strings.Contains(err.Error(), "cellium-operator, cellium-cni missing") || !strings.Contains(err.Error(), "make build") {
		t.Errorf("missing binaries: %v", err)
	}
	if _, err := FindBinaries(dir, "nope"); err == nil {
		t.Error("unknown program: no error")
	}
}

func TestProcesses(t *testing.T) {
	op := OperatorConfig{Binary: "/bin/op", Kubeconfig: "/k", Dir: "/d", ClusterPoolIPv4CIDR: "10.1.0.0/16",
		ClusterPoolIPv4MaskSize: 24, Args: []string{"--cilium-endpoint-gc-interval=1s"}}
	p, err := op.Process()
	if err != nil {
		t.Fatal(err)
	}
	if op.APIAddr == "" || !slices.Contains(p.Args, "--operator-api-serve-addr="+op.APIAddr) {
		t.Errorf("operator API address not filled in: %q, %v", op.APIAddr, p.Args)
	}
	for _, want := range []string{"--k8s-kubeconfig-path=/k", "--cluster-pool-ipv4-cidr=10.1.0.0/16",
		"--cluster-pool-ipv4-mask-size=24", "--cilium-endpoint-gc-interval=1s"} {
		if !slices.Contains(p.Args, want) {
			t.Errorf("operator args %v lack %s", p.Args, want)
		}
	}
	if p.LogFile != "/d/cellium-operator.log" || p.PidFile != "/d/cellium-operator.pid" {
		t.Errorf("operator files %s %s", p.LogFile, p.PidFile)
	}

	ag := AgentConfig{Binary: "/bin/ag", Kubeconfig: "/k", NodeName: "n1", Dir: "/d"}
	p, err = ag.Process()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(p.Env, "K8S_NODE_NAME=n1") {
		t.Errorf("agent env %v lacks K8S_NODE_NAME", p.Env)
	}
	for _, want := range []string{"--k8s-kubeconfig-path=/k", "--socket-path=/d/cellium.sock", "--state-dir=/d/state",
		"--write-cni-conf-when-ready=/d/net.d/05-cellium.conflist",
		"--enable-endpoint-routes=false", "--enable-endpoint-health-checking=false", "--enable-health-checking=false"} {
		if !slices.Contains(p.Args, want) {
			t.Errorf("agent args %v lack %s", p.Args, want)
		}
	}
	if !slices.Contains(p.Args, "--enable-bpf-datapath=false") || slices.ContainsFunc(p.Args, func(a string) bool { return strings.HasPrefix(a, "--bpf-root") }) {
		t.Errorf("agent args %v: want the eBPF datapath off by default, with no --bpf-root", p.Args)
	}
	ag.BPF = true
	if p, _ = ag.Process(); !slices.Contains(p.Args, "--enable-bpf-datapath=true") || !slices.Contains(p.Args, "--bpf-root=/d/bpffs") {
		t.Errorf("agent args with BPF %v: want the eBPF datapath on with its own bpffs /d/bpffs", p.Args)
	}
	ag.Dir = "/" + strings.Repeat("x", 100)
	if _, err := ag.Process(); err == nil || !strings.Contains(err.Error(), "shorter directory") {
		t.Errorf("socket path too long: %v", err)
	}
}

func TestLinkCNIPlugin(t *testing.T) {
	dir := t.TempDir()
	plugin := filepath.Join(dir, "built-plugin")
	if err := os.WriteFile(plugin, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "cni-bin")
	for range 2 { // the second replaces the first
		if err := LinkCNIPlugin(plugin, bin); err != nil {
			t.Fatal(err)
		}
	}
	if target, err := os.Readlink(filepath.Join(bin, CNIPlugin)); err != nil || target != plugin {
		t.Errorf("link %s -> %s, %v", filepath.Join(bin, CNIPlugin), target, err)
	}
}
