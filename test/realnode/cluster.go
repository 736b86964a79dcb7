package realnode

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/vishvananda/netlink"

	"github.com/cellium/cellium/install"
	"github.com/cellium/cellium/test/devkubelet/devnode"
	"github.com/cellium/cellium/test/harness"
)

// Address ranges of a [Cluster] (make up): no other test of the project
// uses them. Both are blackholed on the host while the cluster runs.
const (
	// DefaultPodCIDR is the operator's pod address space.
	DefaultPodCIDR = "10.236.0.0/16"
	// DefaultServiceCIDR is the API server's Service range.
	DefaultServiceCIDR = "10.237.0.0/16"
)

// ClusterOptions configure [Up].
type ClusterOptions struct {
	// Dir holds everything: the control plane's files (harness.Options.Dir),
	// the node (Dir/node), the images (Dir/images) and the cluster's state
	// (for [Down]). Created if needed; keep it short (unix sockets live in
	// it).
	Dir string
	// Detach lets every process outlive the caller (make up); [Down] stops
	// them from another process.
	Detach bool
	// PodCIDR and ServiceCIDR default to DefaultPodCIDR and
	// DefaultServiceCIDR.
	PodCIDR, ServiceCIDR string
	// Values are more chart values (helm --set syntax, e.g.
	// "agent.extraArgs={--enable-policy=always}"), after DevValues: they
	// win.
	Values []string
	// Nodes is the number of real nodes, 1 to MaxNodes; 0 means 1. One
	// node runs in the host's namespaces (Dir/node); each of several runs
	// in namespaces of its own ([NodeNamespaces], Dir/node<i>, address
	// NodeIPAt(i)) on the bridge NodesBridge, with the API server on
	// BridgeAddr.
	Nodes int
	// BinDir is where cellium's image gets its programs built
	// ([BuildImageFrom]): make build's bin/, whose current binaries are
	// then packed as they are. Empty: a directory of the cluster's.
	BinDir string
	// NodeBinaries are the node's programs; zero: the cached ones
	// (harness.EnsureNodeBinaries, which builds what is missing).
	NodeBinaries harness.NodeBinaries
	// StartTimeout bounds the start of each component; default 2 minutes
	// (the agent's DaemonSet gets twice that).
	StartTimeout time.Duration
	// HubbleRelay deploys hubble-relay from the chart
	// (hubble.relay.enabled) with the upstream relay packed locally
	// (HubbleRelaySpec), and Up waits for it to be Ready: make up's. The
	// operator then serves the service map (hubble.serviceMap.enabled).
	HubbleRelay bool
	// KubeProxyReplacement runs no kube-proxy on any node and installs
	// cellium with the chart's kubeProxyReplacement=true: cellium's
	// datapath serves every Service type (make up KPR=true).
	KubeProxyReplacement bool
	// KVStore installs cellium in the etcd kvstore mode
	// (Documentation/operations/kvstore.md): identities, nodes and ipcache
	// entries go through the control plane's etcd ([KVStoreValues] before
	// Values), which agents and operator reach on 127.0.0.1 (one node, in
	// the host's namespaces) or, with several nodes, on BridgeAddr, where
	// etcd then listens too (harness.Options.EtcdAddress).
	KVStore bool
	// Logger receives progress; nil discards it.
	Logger *slog.Logger
}

// Cluster is a control plane (etcd, kube-apiserver with the Node and RBAC
// authorizers, kube-controller-manager) and one real node (containerd,
// kubelet, kube-scheduler, kube-proxy in nftables mode) with cellium
// installed from its Helm chart: the agent's DaemonSet and the operator's
// Deployment, from the locally packed image imported into containerd, and
// CoreDNS as the cluster DNS ([DeployCoreDNS]). No cellium process runs
// outside a pod.
type Cluster struct {
	Control *harness.Cluster
	// Node is Nodes[0] (the node of a one-node cluster).
	Node *Node
	// Nodes are the cluster's nodes in start order.
	Nodes []*Node
	Dir   string
	// DNSServiceIP is the ClusterIP of the kube-dns Service (CoreDNS), the
	// pods' nameserver.
	DNSServiceIP netip.Addr

	opts  ClusterOptions
	log   *slog.Logger
	state clusterState
	// unlock releases harness.LockHostNetwork, which a cluster of several
	// nodes holds while it runs; nil if not held.
	unlock func()
}

// NodesBridge is the bridge in the host's network namespace that the
// nodes of a several-node cluster meet on (BridgeAddr/24).
const NodesBridge = "crnbr0"

// clusterStateFile, in the cluster's directory, records what [Down] needs.
const clusterStateFile = "realcluster.json"

// clusterState is what Up changed outside the processes' directories.
type clusterState struct {
	NodeDir    string `json:"nodeDir"`
	PodCIDR    string `json:"podCIDR,omitempty"`
	Kubeconfig string `json:"kubeconfig,omitempty"`
	// Blackholes are the routes Up added (those that were there before are
	// not listed: Down leaves them).
	Blackholes []string `json:"blackholes,omitempty"`
	// NodeDirs are the directories of the nodes of a several-node cluster
	// in start order (NodeDir is the first); empty for one node.
	NodeDirs []string `json:"nodeDirs,omitempty"`
	// Bridge is the nodes' bridge if Up made it.
	Bridge string `json:"bridge,omitempty"`
	// Routes are the host's routes to the nodes' pod CIDRs Up added.
	Routes []podCIDRRoute `json:"routes,omitempty"`
}

// podCIDRRoute is a route of the host's main table to a node's pod CIDR
// via the node's address on the bridge.
type podCIDRRoute struct {
	CIDR string `json:"cidr"`
	Via  string `json:"via"`
}

// Up starts a [Cluster] in opts.Dir and waits until the node is Ready, the
// agent's pod is Ready, the operator runs and the cluster DNS answers
// (CoreDNS Ready behind the kube-dns Service at [DNSServiceIP] of the
// Service range, the kubelet's clusterDNS). The API server advertises the
// node's IP as the kubernetes Service's endpoint, so pods reach it through
// the Service's ClusterIP (it listens on every address of the machine). On
// error everything started is stopped and removed again.
//
// Only one Cluster may run on the machine at a time (kube-proxy's
// nftables tables and the agent's host routing are the machine's).
//
// Errors: not root; a binary is missing and cannot be built; a component
// does not start in time.
func Up(ctx context.Context, opts ClusterOptions) (_ *Cluster, err error) {
	if opts.Dir == "" {
		return nil, errors.New("real cluster: no directory")
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, err
	}
	if opts.Nodes == 0 {
		opts.Nodes = 1
	}
	if err := CheckNodeCount(opts.Nodes); err != nil {
		return nil, err
	}
	if opts.PodCIDR == "" {
		opts.PodCIDR = DefaultPodCIDR
	}
	if opts.ServiceCIDR == "" {
		opts.ServiceCIDR = DefaultServiceCIDR
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = 2 * time.Minute
	}
	if opts.KubeProxyReplacement {
		// Before the caller's values: theirs win.
		opts.Values = append([]string{"kubeProxyReplacement=true"}, opts.Values...)
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("real cluster: needs root (containerd, the kubelet, network namespaces)")
	}
	if opts.NodeBinaries.Kubelet == "" {
		if opts.NodeBinaries, err = harness.EnsureNodeBinaries(ctx, log); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("real cluster: %w", err)
	}
	c := &Cluster{Dir: dir, opts: opts, log: log, state: clusterState{NodeDir: filepath.Join(dir, "node"), PodCIDR: opts.PodCIDR}}
	if err := c.writeState(); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			err = errors.Join(fmt.Errorf("real cluster in %s: %w", dir, err), c.Stop(context.Background()))
		}
	}()
	if opts.Nodes > 1 {
		if err := c.upSeveral(ctx); err != nil {
			return nil, err
		}
		return c, nil
	}
	// Nothing sent to the pods' or Services' addresses leaves the machine.
	for _, p := range []string{opts.PodCIDR, opts.ServiceCIDR} {
		prefix, err := netip.ParsePrefix(p)
		if err != nil {
			return nil, err
		}
		added, err := addBlackhole(prefix)
		if err != nil {
			return nil, err
		}
		if added {
			c.state.Blackholes = append(c.state.Blackholes, p)
			if err := c.writeState(); err != nil {
				return nil, err
			}
		}
	}

	dnsIP, err := DNSServiceIP(opts.ServiceCIDR)
	if err != nil {
		return nil, err
	}
	// The node's IP is picked first: the API server advertises it as the
	// kubernetes Service's endpoint, which pods (CoreDNS) reach through
	// the Service's ClusterIP; 127.0.0.1 is another namespace's loopback
	// for them.
	nodeIP, err := PickNodeIP()
	if err != nil {
		return nil, err
	}
	c.Control, err = harness.Start(ctx, harness.Options{
		Dir:                   dir,
		Detach:                opts.Detach,
		ControllerManager:     true,
		NodeAuthorizer:        true,
		APIServerArgs:         []string{"--kubelet-preferred-address-types=InternalIP"},
		ServiceClusterIPRange: opts.ServiceCIDR,
		AdvertiseAddress:      nodeIP,
		StartTimeout:          opts.StartTimeout,
		Logger:                log,
	})
	if err != nil {
		return nil, err
	}
	c.state.Kubeconfig = c.Control.Kubeconfig()
	if err := c.writeState(); err != nil {
		return nil, err
	}
	images, err := opts.packImages(ctx, filepath.Join(dir, "images"), log)
	if err != nil {
		return nil, err
	}
	dnsImage, dnsImageName, err := CoreDNSImage(filepath.Join(dir, "images"), opts.NodeBinaries)
	if err != nil {
		return nil, err
	}
	images = append(images, dnsImage)
	c.Node, err = Start(ctx, Options{
		IP:           nodeIP,
		ClusterDNS:   dnsIP.String(),
		Cluster:      c.Control,
		Binaries:     opts.NodeBinaries,
		Dir:          c.state.NodeDir,
		Images:       images,
		Scheduler:    true,
		KubeProxy:    !opts.KubeProxyReplacement,
		ClusterCIDR:  opts.PodCIDR,
		StartTimeout: opts.StartTimeout,
		Detach:       opts.Detach,
		Logger:       log,
	})
	if err != nil {
		return nil, err
	}
	if err := Install(ctx, c.Control, c.Node, InstallOptions{PodCIDR: opts.PodCIDR, Values: c.installValues(), HubbleRelay: opts.HubbleRelay, Logger: log}); err != nil {
		return nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, 2*opts.StartTimeout)
	defer cancel()
	if err := WaitInstalled(wctx, c.Control.Clientset()); err != nil {
		return nil, err
	}
	if err := c.Node.WaitReady(ctx); err != nil {
		return nil, err
	}
	// The cluster DNS, once the pods have a network.
	log.Info("deploying CoreDNS", "image", dnsImageName, "service", DNSService, "clusterIP", dnsIP)
	if err := DeployCoreDNS(ctx, c.Control, dnsImageName, dnsIP); err != nil {
		return nil, err
	}
	dctx, dcancel := context.WithTimeout(ctx, opts.StartTimeout)
	defer dcancel()
	if err := WaitCoreDNS(dctx, c.Control.Clientset()); err != nil {
		return nil, fmt.Errorf("CoreDNS: %w", err)
	}
	c.DNSServiceIP = dnsIP
	if err := c.waitRelay(ctx); err != nil {
		return nil, err
	}
	log.Info("real cluster ready", "kubeconfig", c.Kubeconfig(), "node", c.Node.Name)
	return c, nil
}

// KVStoreValues are the chart values (helm --set) that install cellium in
// the etcd kvstore mode with the etcd at etcdURL (no TLS): identities as
// etcd keys (identityAllocationMode=kvstore), and agents and operator
// connected to etcd (etcd.enabled, etcd.endpoints: the ConfigMap
// cilium-config's etcd-config, --kvstore=etcd), through which the agents
// also exchange their nodes and ipcache entries.
func KVStoreValues(etcdURL string) []string {
	return []string{"identityAllocationMode=kvstore", "etcd.enabled=true", "etcd.endpoints[0]=" + etcdURL}
}

// installValues are the chart values Up installs with after the defaults:
// KVStoreValues with the etcd the nodes reach (ClusterOptions.KVStore),
// then the caller's, which win.
func (c *Cluster) installValues() []string {
	if !c.opts.KVStore {
		return c.opts.Values
	}
	url := c.Control.EtcdURL()
	if u := c.Control.EtcdAddressURL(); u != "" {
		url = u
	}
	return append(KVStoreValues(url), c.opts.Values...)
}

// packImages packs the cluster's images into dir (cellium's from
// opts.BinDir when set) and returns their archives.
func (opts ClusterOptions) packImages(ctx context.Context, dir string, log *slog.Logger) ([]string, error) {
	specs := []ImageSpec{PauseSpec, DemoSpec, CelliumSpec}
	if opts.HubbleRelay {
		specs = append(specs, HubbleRelaySpec)
	}
	var images []string
	for _, spec := range specs {
		log.Info("packing image", "name", spec.Name)
		binDir := ""
		if spec.Name == CelliumImage {
			binDir = opts.BinDir
		}
		img, err := BuildImageFrom(ctx, dir, binDir, spec)
		if err != nil {
			return nil, err
		}
		images = append(images, img)
	}
	return images, nil
}

// waitRelay waits for hubble-relay when the cluster has it.
func (c *Cluster) waitRelay(ctx context.Context) error {
	if !c.opts.HubbleRelay {
		return nil
	}
	rctx, cancel := context.WithTimeout(ctx, c.opts.StartTimeout)
	defer cancel()
	if err := WaitRelay(rctx, c.Control.Clientset()); err != nil {
		return fmt.Errorf("hubble-relay: %w", err)
	}
	return nil
}

// CheckNodeCount says whether a cluster of n real nodes can be started
// (ClusterOptions.Nodes, make up NODES=n).
//
// Errors: n is outside 1..MaxNodes.
func CheckNodeCount(n int) error {
	if n < 1 || n > MaxNodes {
		return fmt.Errorf("%d nodes: a real cluster has 1 to %d nodes (make up NODES=1..%d)", n, MaxNodes, MaxNodes)
	}
	return nil
}

// ReleaseHostNetworkLock releases the machine-wide lock the node took
// (harness.LockHostNetwork), which Stop releases otherwise: for a caller
// that leaves the cluster running detached (make up) or stops it with
// [Down]. Nothing guards the machine's kube-proxy tables and cilium_host
// from other tests afterwards but their own checks.
func (c *Cluster) ReleaseHostNetworkLock() {
	if c.Node != nil {
		c.Node.releaseLock()
	}
	if c.unlock != nil {
		c.unlock()
		c.unlock = nil
	}
}

// Kubeconfig is the admin's kubeconfig file of the cluster.
func (c *Cluster) Kubeconfig() string { return c.Control.Kubeconfig() }

// AgentSocket is the agent's API socket on the host (the DaemonSet's pod
// creates it there): for the cellium CLI, `cellium --host unix://<socket>`.
func (c *Cluster) AgentSocket() string { return c.Node.AgentConfig().SocketPath() }

// Stop stops the cluster started by [Up] in this process and removes
// everything it made: the node first ([Node.Stop]: the pods' network
// released through the agent, then the agent's host state), the control
// plane, the blackhole routes. The directory stays (the logs).
func (c *Cluster) Stop(ctx context.Context) error {
	var errs []error
	// No controller recreates the pods the node's drain deletes.
	errs = append(errs, stopControllerManager(c.Dir))
	if len(c.Nodes) > 0 {
		// In reverse start order: the first node's saved sysctls (the
		// machine's before any kubelet) are restored last.
		for i := len(c.Nodes) - 1; i >= 0; i-- {
			errs = append(errs, c.Nodes[i].stop(ctx))
		}
	} else if c.Node != nil {
		errs = append(errs, c.Node.stop(ctx))
	}
	if c.Control != nil {
		errs = append(errs, c.Control.Stop())
	}
	errs = append(errs, removePodCIDRRoutes(c.state.Routes), removeBridge(c.state.Bridge))
	errs = append(errs, removeBlackholes(c.state.Blackholes))
	// Only now: the next holder of the lock (a soak, another cluster)
	// adds the same blackholes.
	c.ReleaseHostNetworkLock()
	return errors.Join(errs...)
}

// Leftovers lists what the cluster left on the host after Stop or [Down]:
// the node's leftovers ([Node.Leftovers], the agent's host network
// included), processes still running, the blackhole routes and any other
// route into the pod CIDR (the agent's routes to its pods). Empty means
// clean.
func (c *Cluster) Leftovers() []string {
	if c.unlock != nil || (c.Node != nil && c.Node.unlock != nil) {
		return clusterLeftovers(c.Dir) // this process holds the lock
	}
	return ClusterLeftovers(c.Dir)
}

// lockHostNetworkForCheck takes harness.LockHostNetwork for a leftover
// check (at most 10 minutes of waiting; without the lock the check runs
// anyway) and returns its release.
func lockHostNetworkForCheck() func() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	unlock, err := harness.LockHostNetwork(ctx, func() {})
	if err != nil {
		return func() {}
	}
	return unlock
}

// ClusterLeftovers is [Cluster.Leftovers] for the cluster in dir, from a
// process that does not hold the host network lock (after Stop, make
// down). It looks under the lock: once the cluster released it, another
// test package's agent may own cilium_host and the cellium nftables table
// of this network namespace, and is done with them when it lets go.
func ClusterLeftovers(dir string) []string {
	defer lockHostNetworkForCheck()()
	return clusterLeftovers(dir)
}

func clusterLeftovers(dir string) []string {
	st, err := readClusterState(dir)
	if err != nil {
		return nil
	}
	var out []string
	for _, nd := range st.nodeDirs() {
		if h, err := readHostState(nd); err == nil {
			out = append(out, h.leftovers(nd)...)
		}
	}
	for _, pidDir := range append([]string{dir}, st.nodeDirs()...) {
		files, _ := filepath.Glob(filepath.Join(pidDir, "*.pid"))
		for _, f := range files {
			if pid, running, err := harness.ReadPidFile(f); err == nil && running {
				out = append(out, fmt.Sprintf("process %s (pid %d)", filepath.Base(f), pid))
			}
		}
	}
	for _, p := range st.Blackholes {
		if prefix, err := netip.ParsePrefix(p); err == nil && blackholeExists(prefix) {
			out = append(out, "blackhole route "+p)
		}
	}
	if pool, err := netip.ParsePrefix(st.PodCIDR); err == nil {
		out = append(out, routesInto(pool)...)
	}
	if st.Bridge != "" {
		if _, err := netlink.LinkByName(st.Bridge); err == nil {
			out = append(out, "link "+st.Bridge)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Down stops the cluster in dir that [Up] started with Detach, from any
// process (make down): kube-controller-manager is stopped first (nothing
// recreates pods any more), the pods that are not in the host network are
// deleted and released through the agent while it still runs (best
// effort: an API server or agent that does not answer is skipped), then
// the node's processes are killed and the host cleaned ([Recover]), the
// control plane stopped and the blackhole routes removed. The directory
// stays. A dir without a cluster state is no error.
//
// Errors: something cannot be stopped or removed.
func Down(ctx context.Context, dir string, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	st, err := readClusterState(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	// No controller recreates the pods the drain deletes.
	if err := stopControllerManager(dir); err != nil {
		return err
	}
	var errs []error
	// In reverse start order, as Stop (the first node's saved sysctls are
	// restored last).
	nodeDirs := st.nodeDirs()
	for i := len(nodeDirs) - 1; i >= 0; i-- {
		nd := nodeDirs[i]
		if h, err := readHostState(nd); err == nil && h.AgentInPod && st.Kubeconfig != "" {
			socket := h.AgentSocket
			if socket == "" {
				socket = filepath.Join(nd, "agent", "cellium.sock")
			}
			if err := drainFrom(ctx, st.Kubeconfig, h.Name, socket); err != nil {
				log.Warn("could not release the pods' network through the agent; their namespaces and veths go with their processes", "node", h.Name, "error", err)
			}
		}
		errs = append(errs, Recover(nd, log))
	}
	pidFiles, err := filepath.Glob(filepath.Join(dir, "*.pid"))
	errs = append(errs, err)
	// The API server before etcd.
	slices.SortFunc(pidFiles, func(a, b string) int { return controlPlaneOrder(a) - controlPlaneOrder(b) })
	for _, f := range pidFiles {
		errs = append(errs, harness.StopPidFile(f, stopTimeout))
	}
	errs = append(errs, removePodCIDRRoutes(st.Routes), removeBridge(st.Bridge))
	errs = append(errs, removeBlackholes(st.Blackholes))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("stop real cluster in %s: %w", dir, err)
	}
	return nil
}

// stopControllerManager stops the cluster's kube-controller-manager (by
// its pid file in dir), so that no ReplicaSet, Job or DaemonSet controller
// recreates the pods a drain deletes.
func stopControllerManager(dir string) error {
	return harness.StopPidFile(filepath.Join(dir, harness.KubeControllerManager+".pid"), stopTimeout)
}

// controlPlaneOrder sorts the control plane's pid files in stop order.
func controlPlaneOrder(pidFile string) int {
	switch filepath.Base(pidFile) {
	case harness.KubeControllerManager + ".pid":
		return 0
	case harness.KubeAPIServer + ".pid":
		return 1
	case harness.Etcd + ".pid":
		return 3
	}
	return 2
}

// drainFrom runs DrainPodNetwork with the admin's kubeconfig.
func drainFrom(ctx context.Context, kubeconfig, node, socket string) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	cfg.Timeout = 10 * time.Second
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	return DrainPodNetwork(ctx, cs, node, socket)
}

// ContainerdSockets returns the containerd sockets of every node of the
// cluster in dir (one for a one-node cluster), in start order.
//
// Errors: dir holds no cluster state.
func ContainerdSockets(dir string) ([]string, error) {
	st, err := readClusterState(dir)
	if err != nil {
		return nil, err
	}
	dirs := st.NodeDirs
	if len(dirs) == 0 {
		dirs = []string{st.NodeDir}
	}
	sockets := make([]string, len(dirs))
	for i, d := range dirs {
		sockets[i] = (&Node{Dir: d}).ContainerdSocket()
	}
	return sockets, nil
}

// IsClusterDir reports whether dir holds the state of a Cluster (Up was
// called with it).
func IsClusterDir(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, clusterStateFile))
	return err == nil
}

func (c *Cluster) writeState() error {
	b, err := json.MarshalIndent(c.state, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(c.Dir, clusterStateFile), append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("record cluster state: %w", err)
	}
	return nil
}

// nodeDirs are the directories of the cluster's nodes in start order.
func (st clusterState) nodeDirs() []string {
	if len(st.NodeDirs) > 0 {
		return st.NodeDirs
	}
	return []string{st.NodeDir}
}

func readClusterState(dir string) (clusterState, error) {
	var st clusterState
	b, err := os.ReadFile(filepath.Join(dir, clusterStateFile))
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("read %s: %w", filepath.Join(dir, clusterStateFile), err)
	}
	return st, nil
}

func removeBlackholes(prefixes []string) error {
	var errs []error
	for _, p := range prefixes {
		prefix, err := netip.ParsePrefix(p)
		if err == nil {
			err = removeBlackhole(prefix)
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// InstallOptions configure [Install].
type InstallOptions struct {
	// PodCIDR is the operator's pod address space (DefaultPodCIDR if
	// empty).
	PodCIDR string
	// Values are more chart values after DevValues (helm --set syntax).
	Values []string
	// DefaultPaths installs with [ClusterValues] instead of DevValues: the
	// chart's default host paths (nodes in namespaces of their own, each
	// path its own folder) and the API server at its URL's host.
	DefaultPaths bool
	// HubbleRelay deploys hubble-relay (hubble.relay.enabled), from
	// HubbleRelayImage which the nodes must have, and the operator's
	// service map of its flows (hubble.serviceMap.enabled).
	HubbleRelay bool
	// Logger receives progress; nil discards it.
	Logger *slog.Logger
}

// DevValues are the chart values (helm --set) that install cellium on node
// n of the cluster whose API server listens on apiPort of 127.0.0.1, as a
// user installs the chart, with what differs on this machine:
//
//   - the image is the locally packed one (CelliumImage), never pulled;
//   - the agent and the operator reach the API server on 127.0.0.1
//     (k8sServiceHost), as Cilium's agent reaches it without the
//     kubernetes Service it implements (the Service's endpoint, the node
//     IP, is for pods: CoreDNS);
//   - every host path of the agent is inside the node's directory, where
//     the node's containerd looks for them (CNI binaries and conflist, its
//     netns directory) or where nothing else on the machine collides
//     (socket, state, bpffs, the cgroup2 mount of the socket load
//     balancer); the socket is the node's
//     AgentConfig().SocketPath();
//   - no masquerading (pods reach each other and the node, nothing else);
//   - CNI chaining with portmap, so that pods' hostPorts work (the
//     Kubernetes conformance spec of hostPort);
//   - one operator replica, its health port free on this machine;
//   - hubble-relay, when enabled, from the locally packed HubbleRelayImage.
func DevValues(n *Node, apiPort, operatorPort int, podCIDR string) []string {
	agentDir := n.AgentConfig().Dir
	return []string{
		"image.repository=cellium.local/cellium",
		"image.tag=dev",
		"image.pullPolicy=Never",
		"k8sServiceHost=127.0.0.1",
		"k8sServicePort=" + strconv.Itoa(apiPort),
		"agent.socketDir=" + agentDir,
		"agent.stateDir=" + n.AgentConfig().StateDir(),
		"agent.cni.binDir=" + n.CNIBinDir(),
		"agent.cni.confDir=" + n.AgentConfig().CNIConfDir(),
		"agent.bpffsDir=" + filepath.Join(agentDir, "bpffs"),
		"agent.cgroupRoot=" + filepath.Join(agentDir, "cgroupv2"),
		"agent.netnsDir=" + n.NetnsDir(),
		"agent.ipv4Masquerade=false",
		"cni.chainingMode=portmap",
		"operator.replicas=1",
		"operator.apiServeAddr=localhost:" + strconv.Itoa(operatorPort),
		"operator.clusterPool.ipv4CIDR={" + podCIDR + "}",
		"operator.clusterPool.ipv4MaskSize=24",
		"hubble.relay.image.repository=" + imageRepository(HubbleRelayImage),
		"hubble.relay.image.tag=" + imageTag(HubbleRelayImage),
		"hubble.relay.image.pullPolicy=Never",
	}
}

// imageRepository and imageTag split an image reference name:tag.
func imageRepository(ref string) string { r, _, _ := strings.Cut(ref, ":"); return r }
func imageTag(ref string) string        { _, t, _ := strings.Cut(ref, ":"); return t }

// Install installs cellium on a node started without an agent process
// (Options.Agent empty): the Helm chart rendered with [DevValues] and
// opts.Values (also
// written to the node's directory as cellium.yaml) and applied with
// server-side apply, like `kubectl apply --server-side -f`. It does not
// wait: see [WaitInstalled].
//
// Errors: helm cannot be built or fails; the API server refuses an object.
func Install(ctx context.Context, c *harness.Cluster, n *Node, opts InstallOptions) error {
	if opts.PodCIDR == "" {
		opts.PodCIDR = DefaultPodCIDR
	}
	helm, err := harness.EnsureHelm(ctx, opts.Logger)
	if err != nil {
		return err
	}
	root, err := harness.RepoRoot(".")
	if err != nil {
		return err
	}
	u, err := url.Parse(c.APIServerURL())
	if err != nil {
		return fmt.Errorf("install cellium: %w", err)
	}
	apiPort, err := strconv.Atoi(u.Port())
	if err != nil {
		return fmt.Errorf("install cellium: API server port of %s: %w", c.APIServerURL(), err)
	}
	opPort, err := devnode.FreePort()
	if err != nil {
		return err
	}
	values := DevValues(n, apiPort, opPort, opts.PodCIDR)
	if opts.DefaultPaths {
		values = ClusterValues(u.Hostname(), apiPort, opPort, opts.PodCIDR)
	}
	if opts.HubbleRelay {
		// The relay starts before CoreDNS (Up deploys it once the pods
		// have a network): its first look-up of hubble-peer fails, and it
		// tries again after retryTimeout (30 s by default).
		// The operator serves the service map of the relay's flows.
		values = append(values, "hubble.relay.enabled=true", "hubble.relay.retryTimeout=5s", "hubble.serviceMap.enabled=true")
	}
	out, err := install.RenderWith(ctx, helm, root, append(values, opts.Values...)...)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(n.Dir, "cellium.yaml"), out, 0o644); err != nil {
		return fmt.Errorf("install cellium: %w", err)
	}
	objs, err := install.Objects(out)
	if err != nil {
		return err
	}
	if err := c.ApplyObjects(ctx, objs); err != nil {
		return fmt.Errorf("install cellium: %w", err)
	}
	return nil
}

// Names of the workloads of the chart.
const (
	AgentDaemonSet     = "cellium-agent"
	OperatorDeployment = "cellium-operator"
	// RelayDeployment and RelayService are hubble-relay's
	// (hubble.relay.enabled); the Service's port is 80.
	RelayDeployment = "hubble-relay"
	RelayService    = "hubble-relay"
)

// WaitInstalled waits until the agent's DaemonSet has every pod Ready and
// the operator's Deployment a ready replica.
//
// Errors: ctx ends first (with what is not ready).
func WaitInstalled(ctx context.Context, cs kubernetes.Interface) error {
	return devnode.WaitFor(ctx, nil, func() error {
		ds, err := cs.AppsV1().DaemonSets(install.Namespace).Get(ctx, AgentDaemonSet, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if ds.Status.DesiredNumberScheduled == 0 || ds.Status.NumberReady < ds.Status.DesiredNumberScheduled {
			return fmt.Errorf("DaemonSet %s: %d of %d pods ready", AgentDaemonSet, ds.Status.NumberReady, ds.Status.DesiredNumberScheduled)
		}
		var dep *appsv1.Deployment
		if dep, err = cs.AppsV1().Deployments(install.Namespace).Get(ctx, OperatorDeployment, metav1.GetOptions{}); err != nil {
			return err
		}
		if dep.Status.ReadyReplicas < 1 {
			return fmt.Errorf("Deployment %s: no ready replica", OperatorDeployment)
		}
		return nil
	})
}

// WaitRelay waits until hubble-relay's Deployment has a ready replica:
// the relay reached the agents' Peer service through the hubble-peer
// Service, whose name it resolves through the cluster DNS (so after
// CoreDNS).
//
// Errors: ctx ends first.
func WaitRelay(ctx context.Context, cs kubernetes.Interface) error {
	return devnode.WaitFor(ctx, nil, func() error {
		dep, err := cs.AppsV1().Deployments(install.Namespace).Get(ctx, RelayDeployment, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if dep.Status.ReadyReplicas < 1 {
			return fmt.Errorf("Deployment %s: no ready replica", RelayDeployment)
		}
		return nil
	})
}
