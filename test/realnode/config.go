package realnode

import (
	"bytes"
	"fmt"
	"text/template"
)

// SandboxImage is the pause image the kubelet v1.37 and containerd v2.4
// expect (kubeadm's PauseVersion and containerd's DefaultSandboxImage): the
// node's own pause program is packed under this name and set as
// containerd's sandbox image, so nothing is ever pulled.
const SandboxImage = "registry.k8s.io/pause:3.10.2"

// containerdConfig is what the containerd configuration is rendered from.
type containerdConfig struct {
	Root, State, Temp string // containerd's directories
	Socket            string // gRPC socket; the ttrpc one is Socket.ttrpc
	ShimSocketDir     string // the shims' sockets
	RuncRoot          string // runc's state
	Runc              string // the runc binary
	CNIBinDir         string
	CNIConfDir        string
	SandboxImage      string
	// NetnsInVarRun pins the pods' network namespaces in /var/run/netns
	// (containerd's default, a node's own folder in its mount namespace)
	// instead of under the state directory (/var/run/netns is the
	// machine's for a node in the host's namespaces).
	NetnsInVarRun bool
}

var containerdTemplate = template.Must(template.New("containerd").Parse(`# containerd of a cellium real test node (test/realnode): every path is
# the node's own, nothing is read from /etc/containerd.
version = 4
root = {{printf "%q" .Root}}
state = {{printf "%q" .State}}
temp = {{printf "%q" .Temp}}
imports = []

[plugins]
  [plugins.'io.containerd.server.v1.grpc']
    address = {{printf "%q" .Socket}}
  [plugins.'io.containerd.server.v1.ttrpc']
    address = {{printf "%q" (print .Socket ".ttrpc")}}
  [plugins.'io.containerd.server.v1.debug']
    address = ''
  [plugins.'io.containerd.shim.v1.manager']
    socket_dir = {{printf "%q" .ShimSocketDir}}
  [plugins.'io.containerd.internal.v1.opt']
    path = {{printf "%q" (print .Root "/opt")}}
  [plugins.'io.containerd.image-verifier.v1.bindir']
    bin_dir = {{printf "%q" (print .Root "/image-verifier")}}
  # No NRI: its socket would be /var/run/nri/nri.sock, shared by every
  # containerd on the machine.
  [plugins.'io.containerd.nri.v1.nri']
    disable = true

  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = {{printf "%q" .SandboxImage}}

  [plugins.'io.containerd.cri.v1.runtime']
    # root lacks CAP_SYS_RESOURCE here: without this, sandboxes fail with
    # "can't get final child's PID from pipe".
    restrict_oom_score_adj = true
    # Pods' network namespaces under the state directory, or in
    # /var/run/netns (a node's own in its mount namespace).
    netns_mounts_under_state_dir = {{not .NetnsInVarRun}}
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = [{{printf "%q" .CNIBinDir}}]
      conf_dir = {{printf "%q" .CNIConfDir}}
      max_conf_num = 1
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = {{printf "%q" .Runc}}
          Root = {{printf "%q" .RuncRoot}}
          SystemdCgroup = false

  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = '127.0.0.1'
    stream_server_port = '0'
`))

func (c containerdConfig) render() ([]byte, error) {
	var b bytes.Buffer
	if err := containerdTemplate.Execute(&b, c); err != nil {
		return nil, fmt.Errorf("render containerd configuration: %w", err)
	}
	return b.Bytes(), nil
}

// kubeletConfig is what the KubeletConfiguration is rendered from.
type kubeletConfig struct {
	RuntimeSocket string // containerd's socket
	CgroupRoot    string // e.g. /cellium-10-254-3-7: the node's cgroup tree
	PodLogsDir    string
	NodeIP        string // the kubelet's server listens here
	Port          int    // the kubelet's server port
	HealthzPort   int    // on 127.0.0.1
	ClientCAFile  string // the cluster CA: who may call the kubelet's API
	// ClusterDNS is the cluster DNS Service's ClusterIP (kube-dns) the
	// pods' resolv.conf names, with ClusterDomain as their search domain;
	// empty: the pods get the host's resolv.conf.
	ClusterDNS    string
	ClusterDomain string
}

var kubeletTemplate = template.Must(template.New("kubelet").Parse(`# kubelet of a cellium real test node (test/realnode).
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# cgroup v1 (hybrid) without systemd on this machine.
cgroupDriver: cgroupfs
failCgroupV1: false
cgroupRoot: {{printf "%q" .CgroupRoot}}
containerRuntimeEndpoint: {{printf "%q" (print "unix://" .RuntimeSocket)}}
imageServiceEndpoint: {{printf "%q" (print "unix://" .RuntimeSocket)}}
podLogsDir: {{printf "%q" .PodLogsDir}}
address: {{printf "%q" .NodeIP}}
port: {{.Port}}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {{.HealthzPort}}
# Only clients with a certificate of the cluster's CA (the API server
# for logs and exec, the tests) reach the kubelet's API.
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: false
  x509:
    clientCAFile: {{printf "%q" .ClientCAFile}}
authorization:
  mode: AlwaysAllow
failSwapOn: false
serializeImagePulls: false
# A test node shares the machine's disk: never evict for it.
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "1%"
  imagefs.available: "1%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
nodeStatusUpdateFrequency: 2s
{{- if .ClusterDNS}}
# Pods with dnsPolicy ClusterFirst (the default) resolve through the
# cluster's CoreDNS (kube-dns).
clusterDNS:
- {{printf "%q" .ClusterDNS}}
clusterDomain: {{printf "%q" .ClusterDomain}}
{{- end}}
`))

func (c kubeletConfig) render() ([]byte, error) {
	var b bytes.Buffer
	if err := kubeletTemplate.Execute(&b, c); err != nil {
		return nil, fmt.Errorf("render kubelet configuration: %w", err)
	}
	return b.Bytes(), nil
}

// kubeProxyConfig is what the KubeProxyConfiguration is rendered from.
type kubeProxyConfig struct {
	Kubeconfig  string
	NodeName    string
	ClusterCIDR string // the pods' address space
	// BindIP is where health and metrics listen: 127.0.0.1 by default; a
	// node in a network namespace of its own binds its IP, which the host
	// reaches over the bridge (its 127.0.0.1 is the node's own loopback).
	BindIP      string
	HealthzPort int
	MetricsPort int
}

var kubeProxyTemplate = template.Must(template.New("kube-proxy").Parse(`# kube-proxy of a cellium real test node (test/realnode).
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
clientConnection:
  kubeconfig: {{printf "%q" .Kubeconfig}}
hostnameOverride: {{printf "%q" .NodeName}}
clusterCIDR: {{printf "%q" .ClusterCIDR}}
healthzBindAddress: {{printf "%q" (print (or .BindIP "127.0.0.1") ":" .HealthzPort)}}
metricsBindAddress: {{printf "%q" (print (or .BindIP "127.0.0.1") ":" .MetricsPort)}}
# Leave the machine's conntrack sysctls alone.
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
  udpTimeout: 0s
  udpStreamTimeout: 0s
`))

func (c kubeProxyConfig) render() ([]byte, error) {
	var b bytes.Buffer
	if err := kubeProxyTemplate.Execute(&b, c); err != nil {
		return nil, fmt.Errorf("render kube-proxy configuration: %w", err)
	}
	return b.Bytes(), nil
}
