package benchkpr

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/cellium/cellium/test/benchdatapath"
	"github.com/cellium/cellium/test/devkubelet/devnode"
	"github.com/cellium/cellium/test/realnode"
)

// The benchmark's namespace, pods, Service and ports.
const (
	namespace  = "bench-kpr"
	clientPod  = "bk-client"  // on the first node
	clientPod2 = "bk-client2" // on the second node, with the server
	serverPod  = "bk-server"
	benchSvc   = "bk"
	changeSvc  = "bk-change"
	iperfPort  = 5201
	echoPort   = 7000
	httpPort   = 8080
	nodePortIP = 30201 // iperf3 through the NodePort
	nodePortRR = 30700 // echo through the NodePort
)

// bench is one mode's cluster, its pods and the servers started in them.
type bench struct {
	cfg  Config
	mode string
	c    *realnode.Cluster
	cs   kubernetes.Interface
	log  *slog.Logger

	// /proc/<pid>/ns/net of the pods; watchNetns of a client pod on each
	// node, in the nodes' order.
	clientNetns, serverNetns string
	watchNetns               []string
	serverIP                 netip.Addr
	clusterIP, changeIP      netip.Addr
	servers                  []*exec.Cmd
	services                 int // bulk Services created so far
}

func newBench(ctx context.Context, cfg Config, c *realnode.Cluster, mode string, log *slog.Logger) (*bench, error) {
	rc := *c.Control.RESTConfig()
	rc.QPS, rc.Burst = 1000, 2000
	cs, err := kubernetes.NewForConfig(&rc)
	if err != nil {
		return nil, err
	}
	b := &bench{cfg: cfg, mode: mode, c: c, cs: cs, log: log}
	if err := b.deploy(ctx); err != nil {
		b.close()
		return nil, err
	}
	return b, nil
}

// deploy creates the pods (client on the first node, server on the
// second), the Services, and starts iperf3 and the echo server in the
// server pod.
func (b *bench) deploy(ctx context.Context) error {
	if _, err := b.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("namespace: %w", err)
	}
	ips := map[string]string{}
	pods := []string{clientPod, clientPod2, serverPod}
	nodeOf := map[string]int{clientPod: 0, clientPod2: 1, serverPod: 1}
	for _, name := range pods {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": name}},
			Spec: corev1.PodSpec{
				NodeName: b.c.Nodes[nodeOf[name]].Name,
				Containers: []corev1.Container{{Name: "app", Image: realnode.DemoImage, ImagePullPolicy: corev1.PullNever,
					Ports: []corev1.ContainerPort{{ContainerPort: httpPort}}}},
				AutomountServiceAccountToken: new(bool),
			},
		}
		if _, err := b.cs.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("pod %s: %w", name, err)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if err := devnode.WaitFor(wctx, nil, func() error {
		for _, name := range pods {
			p, err := b.cs.CoreV1().Pods(namespace).Get(wctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" {
				return fmt.Errorf("pod %s is %s", name, p.Status.Phase)
			}
			ips[name] = p.Status.PodIP
		}
		return nil
	}); err != nil {
		return err
	}
	var err error
	if b.serverIP, err = netip.ParseAddr(ips[serverPod]); err != nil {
		return err
	}
	if b.clientNetns, err = podNetns(netip.MustParseAddr(ips[clientPod])); err != nil {
		return err
	}
	if b.serverNetns, err = podNetns(b.serverIP); err != nil {
		return err
	}
	client2, err := podNetns(netip.MustParseAddr(ips[clientPod2]))
	if err != nil {
		return err
	}
	b.watchNetns = []string{b.clientNetns, client2}
	for _, args := range [][]string{
		{"iperf3", "-s", "-p", strconv.Itoa(iperfPort)},
		{b.cfg.Self, "probe", "echo", "-listen", ":" + strconv.Itoa(echoPort)},
	} {
		cmd := exec.Command("nsenter", append([]string{"--net=" + b.serverNetns, "--"}, args...)...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("start %s in the server pod: %w", args[0], err)
		}
		b.servers = append(b.servers, cmd)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: benchSvc},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeNodePort,
			Selector: map[string]string{"app": serverPod},
			Ports: []corev1.ServicePort{
				{Name: "iperf", Port: iperfPort, TargetPort: intstr.FromInt32(iperfPort), NodePort: nodePortIP},
				{Name: "echo", Port: echoPort, TargetPort: intstr.FromInt32(echoPort), NodePort: nodePortRR},
				{Name: "http", Port: httpPort, TargetPort: intstr.FromInt32(httpPort)},
			},
		},
	}
	got, err := b.cs.CoreV1().Services(namespace).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("service %s: %w", benchSvc, err)
	}
	b.clusterIP = netip.MustParseAddr(got.Spec.ClusterIP)
	// The changed Service: no selector, its one EndpointSlice written here.
	got, err = b.cs.CoreV1().Services(namespace).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: changeSvc},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: httpPort, TargetPort: intstr.FromInt32(httpPort)}}},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("service %s: %w", changeSvc, err)
	}
	b.changeIP = netip.MustParseAddr(got.Spec.ClusterIP)
	if _, err := b.cs.DiscoveryV1().EndpointSlices(namespace).Create(ctx, b.changeSlice(nil), metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("slice of %s: %w", changeSvc, err)
	}
	// Every path answers before anything is timed.
	return devnode.WaitFor(wctx, nil, func() error {
		for _, p := range b.paths() {
			if _, err := b.rr(wctx, p, 10); err != nil {
				return fmt.Errorf("%s: %w", p.name, err)
			}
		}
		return nil
	})
}

func (b *bench) close() {
	for _, s := range b.servers {
		_ = s.Process.Kill()
		_ = s.Wait()
	}
	b.servers = nil
}

// path is a way from a client to the server pod.
type path struct {
	name string
	// netns is the client's network namespace ("": this machine's, outside
	// the nodes) and node the node whose cgroup it runs in (nil: none).
	netns string
	node  *realnode.Node
	// iperf and echo are the addresses of the two servers this way.
	iperf, echo netip.AddrPort
}

// Path names, in the report's order.
const (
	pathPodToPod   = "pod -> pod (no Service)"
	pathClusterIP  = "pod -> ClusterIP -> pod"
	pathNodePort   = "outside -> NodePort -> pod"
	pathNodePortNS = "outside -> pod (no Service)"
)

func (b *bench) paths() []path {
	client := b.c.Nodes[0]
	nodeIP := client.IP
	return []path{
		{name: pathPodToPod, netns: b.clientNetns, node: client,
			iperf: netip.AddrPortFrom(b.serverIP, iperfPort), echo: netip.AddrPortFrom(b.serverIP, echoPort)},
		{name: pathClusterIP, netns: b.clientNetns, node: client,
			iperf: netip.AddrPortFrom(b.clusterIP, iperfPort), echo: netip.AddrPortFrom(b.clusterIP, echoPort)},
		// Through the node without the backend: across to the other
		// node, SNAT (externalTrafficPolicy Cluster).
		{name: pathNodePort, iperf: netip.AddrPortFrom(nodeIP, nodePortIP), echo: netip.AddrPortFrom(nodeIP, nodePortRR)},
		{name: pathNodePortNS, iperf: netip.AddrPortFrom(b.serverIP, iperfPort), echo: netip.AddrPortFrom(b.serverIP, echoPort)},
	}
}

// command runs args as a process of p's client: in its network namespace
// and its node's cgroup (where the node's socket programs apply).
func command(ctx context.Context, netnsPath string, node *realnode.Node, args ...string) *exec.Cmd {
	if node != nil {
		args = append([]string{"sh", "-c", `echo $$ > "$0" && exec "$@"`, node.CgroupProcs()}, args...)
	}
	if netnsPath != "" {
		args = append([]string{"nsenter", "--net=" + netnsPath, "--"}, args...)
	}
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// probe runs a measuring probe for p and returns its result.
func (b *bench) probe(ctx context.Context, netnsPath string, node *realnode.Node, args ...string) (ProbeResult, error) {
	out, err := command(ctx, netnsPath, node, append([]string{b.cfg.Self, "probe"}, args...)...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, ee.Stderr)
		}
		return ProbeResult{}, fmt.Errorf("probe %v: %w", args, err)
	}
	var r ProbeResult
	if err := json.Unmarshal(out, &r); err != nil {
		return ProbeResult{}, fmt.Errorf("probe %v printed %q: %w", args, out, err)
	}
	return r, nil
}

func (b *bench) rr(ctx context.Context, p path, n int) (ProbeResult, error) {
	return b.probe(ctx, p.netns, p.node, "rr", "-addr", p.echo.String(), "-n", strconv.Itoa(n), "-timeout", "1s")
}

// iperf measures TCP throughput along p for the configured seconds, in
// bits per second received.
func (b *bench) iperf(ctx context.Context, p path) (float64, error) {
	out, err := command(ctx, p.netns, p.node, "iperf3", "-J", "-c", p.iperf.Addr().String(), "-p", strconv.Itoa(int(p.iperf.Port())),
		"-t", strconv.Itoa(b.cfg.IperfSeconds)).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, ee.Stderr)
		}
		// iperf3 -J says why in its JSON too.
		if _, jerr := benchdatapath.ParseIperf3(out); jerr != nil {
			err = errors.Join(err, jerr)
		}
		return 0, fmt.Errorf("iperf3 to %s: %w", p.iperf, err)
	}
	bps, err := benchdatapath.ParseIperf3(out)
	if err != nil {
		return 0, fmt.Errorf("iperf3 to %s: %w", p.iperf, err)
	}
	return bps, nil
}

// changeSlice is the changed Service's EndpointSlice with the server pod
// as its only endpoint, or none (backend nil).
func (b *bench) changeSlice(backend *netip.Addr) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: changeSvc, Labels: map[string]string{
			discoveryv1.LabelServiceName: changeSvc, discoveryv1.LabelManagedBy: "bench-kpr"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: new("http"), Port: new(int32(httpPort)), Protocol: new(corev1.ProtocolTCP)}},
	}
	if backend != nil {
		s.Endpoints = []discoveryv1.Endpoint{{Addresses: []string{backend.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: new(true), Serving: new(true), Terminating: new(false)}}}
	}
	return s
}

// podNetns finds the network namespace holding addr among those of this
// machine's processes and returns its /proc/<pid>/ns/net path.
func podNetns(addr netip.Addr) (string, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return "", err
	}
	seen := map[string]bool{}
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		p := filepath.Join("/proc", e.Name(), "ns", "net")
		ino, err := os.Readlink(p)
		if err != nil || seen[ino] {
			continue
		}
		seen[ino] = true
		if holds(p, addr) {
			return p, nil
		}
	}
	return "", fmt.Errorf("no process's network namespace has %s", addr)
}

func holds(nsPath string, addr netip.Addr) bool {
	h, err := netns.GetFromPath(nsPath)
	if err != nil {
		return false
	}
	defer h.Close()
	nh, err := netlink.NewHandleAt(h)
	if err != nil {
		return false
	}
	defer nh.Close()
	addrs, err := nh.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return false
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap() == addr {
			return true
		}
	}
	return false
}

// watcher is a "probe watch" on one node: connects to the changed
// Service every millisecond and reports when the answer changes.
type watcher struct {
	cmd *exec.Cmd
	mu  sync.Mutex
	// events are (time, up) in the order seen.
	events []watchEvent
	cond   *sync.Cond
	done   bool
}

// newCond is w's condition, on its mutex.
func newCond(w *watcher) *sync.Cond { return sync.NewCond(&w.mu) }

type watchEvent struct {
	at time.Time
	up bool
}

// startWatcher starts a watch probe in the client pod of node i (in its
// network namespace and the node's cgroup) against the changed Service.
// A pod, not the node's own namespace: the nodes here have no default
// route, and kube-proxy's DNAT of a node's own connection needs one.
func (b *bench) startWatcher(ctx context.Context, i int) (*watcher, error) {
	node := b.c.Nodes[i]
	cmd := command(ctx, b.watchNetns[i], node, b.cfg.Self, "probe", "watch",
		"-addr", netip.AddrPortFrom(b.changeIP, httpPort).String(), "-interval", "1ms")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("watch probe on %s: %w", node.Name, err)
	}
	w := &watcher{cmd: cmd}
	w.cond = newCond(w)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			ns, state, ok := strings.Cut(sc.Text(), " ")
			n, err := strconv.ParseInt(ns, 10, 64)
			if !ok || err != nil {
				continue
			}
			w.mu.Lock()
			w.events = append(w.events, watchEvent{at: time.Unix(0, n), up: state == "up"})
			w.cond.Broadcast()
			w.mu.Unlock()
		}
		w.mu.Lock()
		w.done = true
		w.cond.Broadcast()
		w.mu.Unlock()
	}()
	return w, nil
}

// wait returns the time of the first event at or after since with the
// answer up, waiting at most timeout.
func (w *watcher) wait(since time.Time, up bool, timeout time.Duration) (time.Time, error) {
	// end before the timer: the timer's Broadcast may come before this
	// goroutine waits (it is lost then), but never before end, so the
	// check below sees the deadline passed instead of waiting forever.
	end := time.Now().Add(timeout)
	deadline := time.AfterFunc(timeout, func() {
		w.mu.Lock()
		w.cond.Broadcast()
		w.mu.Unlock()
	})
	defer deadline.Stop()
	w.mu.Lock()
	defer w.mu.Unlock()
	for {
		for _, e := range w.events {
			if !e.at.Before(since) && e.up == up {
				return e.at, nil
			}
		}
		if w.done {
			return time.Time{}, errors.New("the watch probe exited")
		}
		if !time.Now().Before(end) {
			return time.Time{}, fmt.Errorf("no %v answer within %s", map[bool]string{true: "up", false: "down"}[up], timeout)
		}
		w.cond.Wait()
	}
}

func (w *watcher) stop() {
	_ = w.cmd.Process.Kill()
	_ = w.cmd.Wait()
}
