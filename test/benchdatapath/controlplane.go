package benchdatapath

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/client/clientset/versioned"
	api "github.com/cellium/cellium/api/policy"
	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/policy"
	"github.com/cellium/cellium/test/devkubelet/devnode"
	"github.com/cellium/cellium/test/harness"
)

// The control-plane bench: real cellium-agent processes, each in a
// network namespace of its own (its node), against the real API server
// and etcd of test/harness with cellium-operator, with the devkubelet
// running each node's pods through cellium-cni. It times, in each routing
// mode:
//
//   - a node join: a CiliumNode of a new node created in the API server
//     (its Node created just before, as a kubelet registers before its
//     agent publishes the CiliumNode) until every running agent has
//     programmed it: the route to its pod CIDR in the agent's namespace
//     (into cilium_vxlan in tunnel mode, via the node's address in native
//     mode) and the pod CIDR's entry in the agent's pinned ipcache map;
//   - a policy change: a CNP update (a new allowed port) from the moment
//     each agent's policy cell took it (the seen time of its
//     endpoint-policies row) until the new entry is in that node's pinned
//     policy map of its pod; the sample is the slowest node.
//
// The nodes' uplinks meet on a bridge in the root namespace (cpBridge),
// where the API server listens on cpBridgeAddr. Everything is inside
// cpRange, blackholed in the root namespace while the bench runs (the
// bridge's /24 is more specific and reaches only the bench's namespaces).
var (
	cpRange      = netip.MustParsePrefix("10.94.0.0/16")
	cpBridgeAddr = netip.MustParseAddr("10.94.0.254")
	// cpPodPool is the operator's cluster pool: the agents' pod CIDRs.
	cpPodPool = netip.MustParsePrefix("10.94.64.0/18")
)

const (
	cpBridge    = "cbcp0"
	cpNamespace = "benchcp"
	// cpFirstJoinCIDR is the third octet of the first joining node's pod
	// CIDR (10.94.<n>.0/24, above cpPodPool).
	cpFirstJoinCIDR = 128
	// cpFirstJoinIP is the last octet of the first joining node's address.
	cpFirstJoinIP = 100
	// cpFirstPort is the port the policy changes start from.
	cpFirstPort = 20000
)

// Aims of the control-plane rows.
const (
	AimNodeJoin     = 2 * time.Second       // node join programmed on every node, p99
	AimPolicyChange = 50 * time.Millisecond // policy change enforced on every node, p99
)

// ControlPlaneConfig sizes the control-plane bench.
type ControlPlaneConfig struct {
	// Nodes is the number of agents (at least 2).
	Nodes int
	// Joins and PolicyChanges are the samples of each row per mode.
	Joins, PolicyChanges int
	// Modes are the routing modes to measure ("tunnel", "native").
	Modes []string
	// BinDir holds cellium-agent, cellium-operator and cellium-cni (make
	// build's bin/); empty builds them into a temporary directory.
	BinDir string
	// Log receives the harness's and the nodes' progress; nil discards.
	Log *slog.Logger
}

// ControlPlaneMode holds one routing mode's samples.
type ControlPlaneMode struct {
	Mode string
	// Join: CiliumNode create call -> programmed on every agent. Leave:
	// delete call -> gone from every agent.
	Join, Leave []time.Duration
	// Policy: each agent's policy cell took the CNP change -> the entry in
	// that node's pinned policy map, the slowest node. PolicyFromAPI: the
	// update call -> the entry in every node's map.
	Policy, PolicyFromAPI []time.Duration
}

// ControlPlaneResult is what RunControlPlane measured.
type ControlPlaneResult struct {
	Nodes int
	Modes []ControlPlaneMode
}

// cpNode is one node of the bench: its namespace, its agent and kubelet
// (devnode.Node) and the bench's handles on what it programs.
type cpNode struct {
	i     int
	name  string
	ip    netip.Addr
	ns    ns.NetNS
	nl    *netlink.Handle
	dn    *devnode.Node
	maps  *maps.Maps
	pod   string
	epID  uint16
	podID identity.NumericIdentity
}

type controlPlane struct {
	cleanups
	cfg    ControlPlaneConfig
	log    *slog.Logger
	tmp    string
	c      *harness.Cluster
	cs     kubernetes.Interface
	cilium versioned.Interface
	bins   devnode.Binaries
	agentK string
}

// RunControlPlane starts the control plane and, for each mode, the nodes,
// measures the node joins and policy changes, prints them with the aims
// to w and removes everything.
func RunControlPlane(ctx context.Context, cfg ControlPlaneConfig, w io.Writer) (res ControlPlaneResult, err error) {
	switch {
	case cfg.Nodes < 2:
		return res, fmt.Errorf("control-plane bench: %d nodes: at least 2 are needed (a node is programmed by the others)", cfg.Nodes)
	case cfg.Nodes > 20:
		return res, fmt.Errorf("control-plane bench: %d nodes: at most 20 (2 CPUs)", cfg.Nodes)
	case cfg.Joins < 1 || cfg.Joins > 100:
		return res, fmt.Errorf("control-plane bench: %d joins: give 1 to 100 (each joining node takes a /24 of 10.94.128.0/17)", cfg.Joins)
	case cfg.PolicyChanges < 1:
		return res, fmt.Errorf("control-plane bench: %d policy changes: give at least 1", cfg.PolicyChanges)
	}
	for _, m := range cfg.Modes {
		if m != "tunnel" && m != "native" {
			return res, fmt.Errorf("control-plane bench: routing mode %q: give tunnel and/or native", m)
		}
	}
	if err := lookPath("nsenter"); err != nil {
		return res, err
	}
	res.Nodes = cfg.Nodes
	start := time.Now()
	p, stop, err := startControlPlane(ctx, cfg, "cellium-bcp-")
	if err != nil {
		return res, err
	}
	defer func() {
		if cerr := stop(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("clean up: %w", cerr))
		}
	}()
	fmt.Fprintf(w, "control plane: API server, etcd and cellium-operator up in %s; %d agents, each in a network namespace of its own\n",
		time.Since(start).Round(time.Millisecond), cfg.Nodes)
	for _, mode := range cfg.Modes {
		m, err := p.runMode(ctx, mode, w)
		res.Modes = append(res.Modes, m)
		if err != nil {
			return res, fmt.Errorf("routing mode %s: %w", mode, err)
		}
	}
	res.Write(w)
	return res, nil
}

// start makes the bridge and the blackhole, starts the API server, etcd
// and the operator, and finds or builds the binaries.
// startControlPlane starts the API server, etcd and the operator of cfg
// in a temporary directory named after tmpPrefix (short: the agents'
// sockets live below it). stop undoes everything, the directory last; on
// an error nothing is left to stop.
func startControlPlane(ctx context.Context, cfg ControlPlaneConfig, tmpPrefix string) (p *controlPlane, stop func() error, err error) {
	p = &controlPlane{cfg: cfg, log: cfg.Log}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	if p.tmp, err = os.MkdirTemp("", tmpPrefix); err != nil {
		return nil, nil, err
	}
	stop = func() error {
		err := p.run()
		return errors.Join(err, os.RemoveAll(p.tmp))
	}
	if err := p.start(ctx); err != nil {
		return nil, nil, errors.Join(err, stop())
	}
	return p, stop, nil
}

func (p *controlPlane) start(ctx context.Context) error {
	_, dst, _ := net.ParseCIDR(cpRange.String())
	bh := &netlink.Route{Dst: dst, Type: unix.RTN_BLACKHOLE}
	if err := netlink.RouteAdd(bh); err != nil {
		return fmt.Errorf("blackhole %s in the root namespace: %w (another bench running?)", cpRange, err)
	}
	p.add(func() error { return netlink.RouteDel(bh) })
	if _, err := netlink.LinkByName(cpBridge); err == nil {
		return fmt.Errorf("bridge %s exists: another control-plane bench runs, or one crashed (ip link del %s)", cpBridge, cpBridge)
	}
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: cpBridge}}
	if err := netlink.LinkAdd(br); err != nil {
		return fmt.Errorf("bridge %s: %w", cpBridge, err)
	}
	p.add(func() error { return netlink.LinkDel(br) })
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: cpBridgeAddr.AsSlice(), Mask: net.CIDRMask(24, 32)}}
	if err := netlink.AddrAdd(br, addr); err != nil {
		return fmt.Errorf("bridge %s: %w", cpBridge, err)
	}
	if err := netlink.LinkSetUp(br); err != nil {
		return fmt.Errorf("bridge %s: %w", cpBridge, err)
	}

	var err error
	if p.cfg.BinDir != "" {
		p.bins, err = devnode.FindBinaries(p.cfg.BinDir, devnode.Agent, devnode.Operator, devnode.CNIPlugin)
	} else {
		p.bins, err = devnode.BuildBinaries(ctx, filepath.Join(p.tmp, "bin"), devnode.Agent, devnode.Operator, devnode.CNIPlugin)
	}
	if err != nil {
		return err
	}
	p.c, err = harness.Start(ctx, harness.Options{Dir: filepath.Join(p.tmp, "cluster"), BindAddress: cpBridgeAddr, Logger: p.log})
	if err != nil {
		return fmt.Errorf("start the API server: %w", err)
	}
	p.add(p.c.Stop)
	p.cs = p.c.Clientset()
	if p.cilium, err = versioned.NewForConfig(p.c.RESTConfig()); err != nil {
		return err
	}
	if _, err := p.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: cpNamespace}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	if err := p.c.EnsureServiceAccount(ctx, cpNamespace); err != nil {
		return err
	}
	opK, err := p.c.OperatorKubeconfig(ctx)
	if err != nil {
		return err
	}
	if p.agentK, err = p.c.AgentKubeconfig(ctx); err != nil {
		return err
	}
	op, err := devnode.StartOperator(ctx, devnode.OperatorConfig{
		Binary: p.bins.Operator, Kubeconfig: opK, Dir: p.tmp,
		ClusterPoolIPv4CIDR: cpPodPool.String(), ClusterPoolIPv4MaskSize: 24,
	})
	if err != nil {
		return fmt.Errorf("start cellium-operator: %w", err)
	}
	p.add(func() error { return op.Stop(15 * time.Second) })
	return nil
}

// modeArgs are the agent's flags of a routing mode.
func modeArgs(mode string) []string {
	args := []string{
		"--routing-mode=" + mode, "--devices=eth0",
		// The health endpoint's namespace has a fixed name in the
		// machine's /var/run/netns, which the agents share here.
		"--enable-endpoint-health-checking=false", "--enable-health-checking=false",
	}
	if mode == "native" {
		args = append(args, "--auto-direct-node-routes=true", "--ipv4-native-routing-cidr="+cpRange.String())
	}
	return args
}

// runMode starts the nodes with mode's flags, measures and stops them.
func (p *controlPlane) runMode(ctx context.Context, mode string, w io.Writer) (m ControlPlaneMode, err error) {
	m.Mode = mode
	var mc cleanups
	defer func() {
		if cerr := mc.run(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("stop the %s nodes: %w", mode, cerr))
		}
	}()
	start := time.Now()
	nodes := make([]*cpNode, p.cfg.Nodes)
	for i := range nodes {
		if nodes[i], err = p.startNode(ctx, &mc, mode, i+1); err != nil {
			return m, err
		}
	}
	if err := p.startPods(ctx, &mc, nodes); err != nil {
		return m, err
	}
	// Every agent has every other node programmed before anything is
	// timed.
	for _, n := range nodes {
		cn, err := p.cilium.CiliumV2().CiliumNodes().Get(ctx, n.name, metav1.GetOptions{})
		if err != nil {
			return m, err
		}
		cidr, err := netip.ParsePrefix(cn.Spec.IPAM.PodCIDRs[0])
		if err != nil {
			return m, fmt.Errorf("node %s's pod CIDR: %w", n.name, err)
		}
		if _, err := waitProgrammed(ctx, others(nodes, n), mode, cidr, n.ip, true, 60*time.Second); err != nil {
			return m, fmt.Errorf("node %s on the others: %w", n.name, err)
		}
	}
	fmt.Fprintf(w, "control plane, %s mode: %d nodes up with a pod each in %s; nodes %s\n", mode, len(nodes),
		time.Since(start).Round(time.Millisecond), nodeNames(nodes))

	fmt.Fprintf(w, "  node joins (%d)...\n", p.cfg.Joins)
	for k := range p.cfg.Joins {
		j, l, err := p.join(ctx, nodes, mode, k)
		if err != nil {
			return m, fmt.Errorf("join %d: %w", k+1, err)
		}
		m.Join, m.Leave = append(m.Join, j), append(m.Leave, l)
	}
	fmt.Fprintf(w, "  policy changes (%d)...\n", p.cfg.PolicyChanges)
	if m.Policy, m.PolicyFromAPI, err = p.policyChanges(ctx, nodes); err != nil {
		return m, err
	}
	return m, nil
}

func others(all []*cpNode, n *cpNode) []*cpNode {
	var out []*cpNode
	for _, o := range all {
		if o != n {
			out = append(out, o)
		}
	}
	return out
}

func nodeNames(nodes []*cpNode) string {
	var s []string
	for _, n := range nodes {
		s = append(s, fmt.Sprintf("%s (%s)", n.name, n.ip))
	}
	return strings.Join(s, ", ")
}

// startNode makes node i's namespace on the bridge and starts its kubelet
// and agent, with mode's flags and extra.
func (p *controlPlane) startNode(ctx context.Context, mc *cleanups, mode string, i int, extra ...string) (*cpNode, error) {
	n := &cpNode{i: i, name: fmt.Sprintf("bcp-%s-%d", mode[:1], i), ip: netip.AddrFrom4([4]byte{10, 94, 0, byte(i)})}
	var err error
	if n.ns, err = newNetns(mc); err != nil {
		return nil, err
	}
	hostEnd := fmt.Sprintf("cbcp%d%s", i, mode[:1])
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: hostEnd}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(n.ns.Fd()))}
	if err := netlink.LinkAdd(veth); err != nil {
		return nil, fmt.Errorf("node %s uplink: %w", n.name, err)
	}
	mc.add(func() error {
		if l, err := netlink.LinkByName(hostEnd); err == nil {
			return netlink.LinkDel(l)
		}
		return nil
	})
	br, err := netlink.LinkByName(cpBridge)
	if err != nil {
		return nil, err
	}
	if err := netlink.LinkSetMaster(veth, br); err != nil {
		return nil, err
	}
	if err := netlink.LinkSetUp(veth); err != nil {
		return nil, err
	}
	if n.nl, err = netlink.NewHandleAt(netns.NsHandle(int(n.ns.Fd()))); err != nil {
		return nil, err
	}
	mc.add(func() error { n.nl.Close(); return nil })
	err = n.ns.Do(func(ns.NetNS) error {
		for k, v := range map[string]string{"ipv4/ip_forward": "1", "ipv4/conf/all/rp_filter": "0", "ipv4/conf/default/rp_filter": "0"} {
			if err := os.WriteFile("/proc/sys/net/"+k, []byte(v+"\n"), 0); err != nil {
				return err
			}
		}
		// Nothing of the range leaves the node but over eth0's /24.
		_, dst, _ := net.ParseCIDR(cpRange.String())
		if err := netlink.RouteAdd(&netlink.Route{Dst: dst, Type: unix.RTN_BLACKHOLE}); err != nil {
			return err
		}
		for _, name := range []string{"lo", "eth0"} {
			l, err := netlink.LinkByName(name)
			if err != nil {
				return err
			}
			if name == "eth0" {
				if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: n.ip.AsSlice(), Mask: net.CIDRMask(24, 32)}}); err != nil {
					return err
				}
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("node %s namespace: %w", n.name, err)
	}
	dir := filepath.Join(p.tmp, fmt.Sprintf("%s%d", mode[:1], i))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	klog, err := os.Create(filepath.Join(dir, "kubelet.log"))
	if err != nil {
		return nil, err
	}
	mc.add(klog.Close)
	n.dn, err = devnode.NewNode(p.agentK, p.cs, p.bins, devnode.NodeOptions{
		Name: n.name, IP: n.ip, Dir: dir, Netns: n.ns.Path(),
		HostRouting: true, BPF: true, AgentArgs: append(modeArgs(mode), extra...),
		Logger:          slog.New(slog.NewTextHandler(klog, nil)),
		SandboxIDPrefix: fmt.Sprintf("bc%02x", i),
	})
	if err != nil {
		return nil, err
	}
	// Removed last: the agent's objects, after its kubelet and agent.
	mc.add(func() error {
		ctx := context.Background()
		errs := []error{}
		if err := p.cilium.CiliumV2().CiliumNodes().Delete(ctx, n.name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
		if err := p.cs.CoreV1().Nodes().Delete(ctx, n.name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
		return errors.Join(errs...)
	})
	mc.add(func() error {
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		return n.dn.Cleanup(cctx)
	})
	if err := n.dn.StartKubelet(); err != nil {
		return nil, err
	}
	if err := n.dn.StartAgent(ctx); err != nil {
		return nil, err
	}
	if n.maps, err = maps.Open(filepath.Join(n.dn.AgentConfig().BPFRoot(), "cellium")); err != nil {
		return nil, fmt.Errorf("node %s: open the agent's pinned maps: %w", n.name, err)
	}
	mc.add(n.maps.Close)
	return n, nil
}

// startPods runs a pod (app=bcp) on every node and waits for its
// endpoint: its ID and identity, from its CiliumEndpoint.
func (p *controlPlane) startPods(ctx context.Context, mc *cleanups, nodes []*cpNode) error {
	for _, n := range nodes {
		n.pod = "pod-" + n.name
		if err := p.createPod(ctx, mc, n, n.pod, map[string]string{"app": "bcp"}); err != nil {
			return err
		}
	}
	deadline := time.Now().Add(90 * time.Second)
	for _, n := range nodes {
		var err error
		if n.epID, n.podID, err = p.waitEndpoint(ctx, n, n.pod, deadline); err != nil {
			return err
		}
	}
	return nil
}

// createPod creates pod name with labels on node n (the devkubelet runs
// it through cellium-cni); mc deletes it.
func (p *controlPlane) createPod(ctx context.Context, mc *cleanups, n *cpNode, name string, labels map[string]string) error {
	pods := p.cs.CoreV1().Pods(cpNamespace)
	_, err := pods.Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: corev1.PodSpec{NodeName: n.name, Containers: []corev1.Container{{Name: "c", Image: "none"}},
			TerminationGracePeriodSeconds: ptr(int64(0))},
	}, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	mc.add(func() error {
		err := pods.Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	})
	return nil
}

// waitEndpoint waits until pod name on n has a ready CiliumEndpoint with
// an identity and returns its endpoint ID and identity.
func (p *controlPlane) waitEndpoint(ctx context.Context, n *cpNode, name string, deadline time.Time) (uint16, identity.NumericIdentity, error) {
	for {
		cep, err := p.cilium.CiliumV2().CiliumEndpoints(cpNamespace).Get(ctx, name, metav1.GetOptions{})
		if err == nil && cep.Status.ID != 0 && cep.Status.Identity != nil && cep.Status.Identity.ID != 0 &&
			cep.Status.State == ciliumv2.EndpointStateReady {
			return uint16(cep.Status.ID), identity.NumericIdentity(cep.Status.Identity.ID), nil
		}
		if time.Now().After(deadline) {
			return 0, 0, fmt.Errorf("pod %s on %s: no ready CiliumEndpoint with an identity in time (last: %v; agent log %s)",
				name, n.name, err, n.dn.Agent().LogFile())
		}
		select {
		case <-ctx.Done():
			return 0, 0, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// programmed reports whether n has the route to cidr (into cilium_vxlan
// in tunnel mode, via nodeIP in native mode) and cidr's entry in its
// ipcache map (with nodeIP as tunnel endpoint, as in both modes).
func (n *cpNode) programmed(mode string, cidr netip.Prefix, nodeIP netip.Addr) (bool, error) {
	e, err := n.maps.IPCache.Lookup(cidr)
	switch {
	case err != nil && !errors.Is(err, ebpf.ErrKeyNotExist):
		return false, fmt.Errorf("node %s ipcache: %w", n.name, err)
	case err != nil, e.TunnelEndpoint != nodeIP:
		// An LPM lookup may find a shorter prefix: only the pod CIDR's
		// own entry names the node.
		return false, nil
	}
	dst := &net.IPNet{IP: cidr.Addr().AsSlice(), Mask: net.CIDRMask(cidr.Bits(), 32)}
	rs, err := n.nl.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Dst: dst}, netlink.RT_FILTER_DST)
	if err != nil {
		return false, fmt.Errorf("node %s routes: %w", n.name, err)
	}
	for _, r := range rs {
		if mode == "native" && r.Gw != nil && r.Gw.Equal(nodeIP.AsSlice()) {
			return true, nil
		}
		if mode == "tunnel" && r.LinkIndex > 0 {
			l, err := n.nl.LinkByIndex(r.LinkIndex)
			if err == nil && l.Attrs().Name == "cilium_vxlan" {
				return true, nil
			}
		}
	}
	return false, nil
}

// pollEvery is how often the bench looks at the nodes' routes and maps: it
// bounds the timings' resolution.
const pollEvery = time.Millisecond

// waitProgrammed waits until every node in nodes has (want) or no longer
// has (!want) cidr programmed and returns when the last one did.
func waitProgrammed(ctx context.Context, nodes []*cpNode, mode string, cidr netip.Prefix, nodeIP netip.Addr, want bool, timeout time.Duration) (time.Time, error) {
	done := make([]bool, len(nodes))
	left := len(nodes)
	deadline := time.Now().Add(timeout)
	t := time.NewTicker(pollEvery)
	defer t.Stop()
	for {
		for i, n := range nodes {
			if done[i] {
				continue
			}
			ok, err := n.programmed(mode, cidr, nodeIP)
			if err != nil {
				return time.Time{}, err
			}
			if ok == want {
				done[i] = true
				left--
			}
		}
		if left == 0 {
			return time.Now(), nil
		}
		if time.Now().After(deadline) {
			var late []string
			for i, n := range nodes {
				if !done[i] {
					late = append(late, n.name)
				}
			}
			return time.Time{}, fmt.Errorf("%s (via %s) %s on %s after %s (agent log %s)", cidr, nodeIP,
				map[bool]string{true: "not programmed", false: "still programmed"}[want], strings.Join(late, ", "), timeout,
				nodes[0].dn.Agent().LogFile())
		}
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-t.C:
		}
	}
}

// join registers node k (a Node with its InternalIP, then its
// CiliumNode), waits until every agent programmed it, then deletes both
// and waits until every agent forgot it.
func (p *controlPlane) join(ctx context.Context, nodes []*cpNode, mode string, k int) (join, leave time.Duration, err error) {
	name := fmt.Sprintf("bcp-join-%d", k)
	ip := netip.AddrFrom4([4]byte{10, 94, 0, byte(cpFirstJoinIP + k)})
	cidr := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 94, byte(cpFirstJoinCIDR + k), 0}), 24)
	knodes, cns := p.cs.CoreV1().Nodes(), p.cilium.CiliumV2().CiliumNodes()
	defer func() {
		if err != nil {
			_ = cns.Delete(context.Background(), name, metav1.DeleteOptions{})
			_ = knodes.Delete(context.Background(), name, metav1.DeleteOptions{})
		}
	}()
	node, err := knodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		return 0, 0, err
	}
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip.String()}}
	if _, err := knodes.UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		return 0, 0, err
	}
	start := time.Now()
	if _, err := cns.Create(ctx, &ciliumv2.CiliumNode{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: ciliumv2.NodeSpec{
			BootID:    fmt.Sprintf("bcp-boot-%d", k),
			Addresses: []ciliumv2.NodeAddress{{Type: ciliumv2.NodeInternalIP, IP: ip.String()}},
			IPAM:      ciliumv2.IPAMSpec{PodCIDRs: []string{cidr.String()}},
		}}, metav1.CreateOptions{}); err != nil {
		return 0, 0, err
	}
	at, err := waitProgrammed(ctx, nodes, mode, cidr, ip, true, 30*time.Second)
	if err != nil {
		return 0, 0, err
	}
	join = at.Sub(start)
	start = time.Now()
	if err := cns.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		return 0, 0, err
	}
	if err := knodes.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		return 0, 0, err
	}
	at, err = waitProgrammed(ctx, nodes, mode, cidr, ip, false, 30*time.Second)
	if err != nil {
		return 0, 0, err
	}
	return join, at.Sub(start), nil
}

// cpCNP allows pods app=bcp into pods app=bcp on TCP port.
func cpCNP(port int) *ciliumv2.CiliumNetworkPolicy {
	sel := api.EndpointSelector{MatchLabels: map[string]string{"app": "bcp"}}
	return &ciliumv2.CiliumNetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "bcp-allow", Namespace: cpNamespace},
		Spec: &api.Rule{EndpointSelector: &sel, Ingress: []api.IngressRule{{
			IngressCommonRule: api.IngressCommonRule{FromEndpoints: []api.EndpointSelector{sel}},
			ToPorts:           api.PortRules{{Ports: []api.PortProtocol{{Port: strconv.Itoa(port), Protocol: api.ProtoTCP}}}},
		}}},
	}
}

// policyChanges creates the CNP, then changes its port cfg.PolicyChanges
// times; each time it waits until the new port's entry is in every
// node's policy map of its pod, and takes each agent's seen time of the
// change from its endpoint-policies row.
func (p *controlPlane) policyChanges(ctx context.Context, nodes []*cpNode) (seen, fromAPI []time.Duration, err error) {
	cnps := p.cilium.CiliumV2().CiliumNetworkPolicies(cpNamespace)
	cur, err := cnps.Create(ctx, cpCNP(cpFirstPort), metav1.CreateOptions{})
	if err != nil {
		return nil, nil, err
	}
	defer func() { _ = cnps.Delete(context.Background(), cur.Name, metav1.DeleteOptions{}) }()
	pms := make([]*maps.PolicyMap, len(nodes))
	for i, n := range nodes {
		if pms[i], err = maps.OpenPolicyMap(filepath.Join(n.dn.AgentConfig().BPFRoot(), "cellium"), n.epID); err != nil {
			return nil, nil, fmt.Errorf("node %s: endpoint %d's policy map: %w", n.name, n.epID, err)
		}
		defer pms[i].Close()
	}
	if _, err := waitEntries(ctx, nodes, pms, cpFirstPort); err != nil {
		return nil, nil, err
	}
	for k := 1; k <= p.cfg.PolicyChanges; k++ {
		port := cpFirstPort + k
		var start time.Time
		// The operator writes the CNP's status (its Valid condition):
		// an update may meet a newer version.
		for try := 0; ; try++ {
			if cur, err = cnps.Get(ctx, cur.Name, metav1.GetOptions{}); err != nil {
				return nil, nil, err
			}
			cur.Spec = cpCNP(port).Spec
			start = time.Now()
			if cur, err = cnps.Update(ctx, cur, metav1.UpdateOptions{}); err == nil {
				break
			}
			if !apierrors.IsConflict(err) || try == 5 {
				return nil, nil, err
			}
			cur = cpCNP(port)
		}
		at, err := waitEntries(ctx, nodes, pms, port)
		if err != nil {
			return nil, nil, err
		}
		var worst, last time.Duration
		for i, n := range nodes {
			s, err := n.seen(ctx, policy.NewKey(n.podID, policy.Ingress, policy.ProtoTCP, uint16(port), 16))
			if err != nil {
				return nil, nil, err
			}
			if s.Before(start) {
				return nil, nil, fmt.Errorf("node %s: the policy cell's seen time %s is before the CNP update %s: the row is not the change's", n.name, s, start)
			}
			worst = max(worst, at[i].Sub(s))
			last = max(last, at[i].Sub(start))
		}
		seen, fromAPI = append(seen, worst), append(fromAPI, last)
	}
	return seen, fromAPI, nil
}

// waitEntries waits until every node's policy map (pms) allows the
// node's own pod identity (the same labels on every node) in on TCP port,
// and returns when each node got it.
func waitEntries(ctx context.Context, nodes []*cpNode, pms []*maps.PolicyMap, port int) ([]time.Time, error) {
	at := make([]time.Time, len(nodes))
	left := len(nodes)
	deadline := time.Now().Add(30 * time.Second)
	t := time.NewTicker(pollEvery)
	defer t.Stop()
	for {
		for i, n := range nodes {
			if !at[i].IsZero() {
				continue
			}
			_, err := pms[i].Lookup(policy.NewKey(n.podID, policy.Ingress, policy.ProtoTCP, uint16(port), 16))
			switch {
			case err == nil:
				at[i] = time.Now()
				left--
			case !errors.Is(err, ebpf.ErrKeyNotExist):
				return nil, fmt.Errorf("node %s policy map: %w", n.name, err)
			}
		}
		if left == 0 {
			return at, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("port %d not in every node's policy map after 30s (agent log %s)", port, nodes[0].dn.Agent().LogFile())
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

// seen returns the seen time of the agent's endpoint-policies row of n's
// pod, which must hold key.
func (n *cpNode) seen(ctx context.Context, key policy.Key) (time.Time, error) {
	cl := n.dn.AgentClient()
	defer cl.Close()
	raw, err := cl.GetStatedbTable(ctx, policy.TableName)
	if err != nil {
		return time.Time{}, fmt.Errorf("node %s: %s table: %w", n.name, policy.TableName, err)
	}
	var rows []policy.EndpointPolicyRow
	if err := json.Unmarshal(raw, &rows); err != nil {
		return time.Time{}, fmt.Errorf("node %s: %s table: %w", n.name, policy.TableName, err)
	}
	for _, r := range rows {
		if r.EndpointID != n.epID {
			continue
		}
		if r.Policy == nil {
			break
		}
		if _, ok := r.Policy.Ingress.Get(key); !ok {
			return time.Time{}, fmt.Errorf("node %s: endpoint %d's row does not hold %v (changed again?)", n.name, n.epID, key)
		}
		if r.Seen.IsZero() {
			return time.Time{}, fmt.Errorf("node %s: endpoint %d's row has no seen time (an agent older than the bench?)", n.name, n.epID)
		}
		return r.Seen, nil
	}
	return time.Time{}, fmt.Errorf("node %s: no %s row of endpoint %d", n.name, policy.TableName, n.epID)
}

// Aims checks the p99s of every mode.
func (r ControlPlaneResult) Aims() []Aim {
	var out []Aim
	for _, m := range r.Modes {
		j, pc := summarize(m.Join), summarize(m.Policy)
		out = append(out,
			Aim{fmt.Sprintf("%s: node join programmed on all other nodes, p99", m.Mode), fmtDur(j.P99), "<= " + fmtDur(AimNodeJoin), j.N > 0 && j.P99 <= AimNodeJoin},
			Aim{fmt.Sprintf("%s: policy change enforced on every node, p99", m.Mode), fmtDur(pc.P99), "<= " + fmtDur(AimPolicyChange), pc.N > 0 && pc.P99 <= AimPolicyChange},
		)
	}
	return out
}

// Write prints each mode's figures and the aims with PASS/MISS.
func (r ControlPlaneResult) Write(w io.Writer) {
	fmt.Fprintf(w, "\n== control plane across %d nodes (real agents, API server, operator) ==\n", r.Nodes)
	for _, m := range r.Modes {
		fmt.Fprintf(w, "  %s mode:\n", m.Mode)
		fmt.Fprintf(w, "    %-58s %s\n", "node join: CiliumNode create -> programmed on all others", summarize(m.Join))
		fmt.Fprintf(w, "    %-58s %s\n", "node leave: delete -> gone from all others", summarize(m.Leave))
		fmt.Fprintf(w, "    %-58s %s\n", "policy change: agent saw it -> map entry, slowest node", summarize(m.Policy))
		fmt.Fprintf(w, "    %-58s %s\n", "policy change: CNP update call -> map entry on every node", summarize(m.PolicyFromAPI))
	}
	fmt.Fprintf(w, "  (programmed: the route to the pod CIDR and its ipcache map entry; the bench looks every %s)\n", pollEvery)
	fmt.Fprintf(w, "\n== control-plane aims ==\n")
	for _, a := range r.Aims() {
		verdict := "MISS"
		if a.Met {
			verdict = "PASS"
		}
		fmt.Fprintf(w, "  %-4s %-56s %10s  (aim %s)\n", verdict, a.What, a.Value, a.Want)
	}
}
