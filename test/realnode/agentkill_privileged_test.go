package realnode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/cellium/cellium/api/v1/client"
	"github.com/cellium/cellium/install"
)

// Ports of the long-lived streams of checkAgentKill: pod to pod, and
// (with kube-proxy replacement) from this machine through a NodePort.
const (
	streamPort         = 9000
	nodePortStreamPort = 9001
	nodePortStream     = 30183
)

// stream is a TCP connection from one pod to another carrying a byte every
// 100 ms, echoed back: it notes the longest gap between two echoes and
// the first error of either side.
type stream struct {
	ln         net.Listener
	client     net.Conn
	mu         sync.Mutex
	sent, echo int
	last       time.Time
	maxGap     time.Duration
	err        error
	stop       chan struct{}
	done       sync.WaitGroup
}

// startStream listens on listen inside server (a pod's network
// namespace), connects from client's to dial (listen itself, or a Service
// in front of it) and starts sending.
func startStream(server, client ns.NetNS, listen, dial string) (*stream, error) {
	s := &stream{stop: make(chan struct{}), last: time.Now()}
	if err := server.Do(func(ns.NetNS) error {
		var err error
		s.ln, err = net.Listen("tcp", listen)
		return err
	}); err != nil {
		return nil, fmt.Errorf("listen on %s: %w", listen, err)
	}
	if err := client.Do(func(ns.NetNS) error {
		var err error
		s.client, err = net.DialTimeout("tcp", dial, 5*time.Second)
		return err
	}); err != nil {
		s.ln.Close()
		return nil, fmt.Errorf("connect to %s: %w", dial, err)
	}
	s.done.Add(3)
	// The server echoes what it reads.
	go func() {
		defer s.done.Done()
		conn, err := s.ln.Accept()
		if err != nil {
			s.fail(fmt.Errorf("accept: %w", err))
			return
		}
		defer conn.Close()
		if _, err := io.Copy(conn, conn); err != nil && !s.stopping() {
			s.fail(fmt.Errorf("server side: %w", err))
		}
	}()
	// The client sends a byte every 100 ms...
	go func() {
		defer s.done.Done()
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
			_ = s.client.SetWriteDeadline(time.Now().Add(5 * time.Second))
			if _, err := s.client.Write([]byte{'x'}); err != nil {
				s.fail(fmt.Errorf("client write: %w", err))
				return
			}
			s.mu.Lock()
			s.sent++
			s.mu.Unlock()
		}
	}()
	// ...and reads the echoes.
	go func() {
		defer s.done.Done()
		b := make([]byte, 64)
		for {
			n, err := s.client.Read(b)
			if err != nil {
				if !s.stopping() {
					s.fail(fmt.Errorf("client read: %w", err))
				}
				return
			}
			now := time.Now()
			s.mu.Lock()
			s.maxGap = max(s.maxGap, now.Sub(s.last))
			s.last, s.echo = now, s.echo+n
			s.mu.Unlock()
		}
	}()
	return s, nil
}

func (s *stream) stopping() bool {
	select {
	case <-s.stop:
		return true
	default:
		return false
	}
}

func (s *stream) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil {
		s.err = err
	}
}

// state returns the bytes sent and echoed, the longest gap between echoes
// so far (and since the last one) and the first error.
func (s *stream) state() (sent, echo int, gap time.Duration, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sent, s.echo, max(s.maxGap, time.Since(s.last)), s.err
}

// check fails t if the stream broke or stalled for more than a second.
func (s *stream) check(t *testing.T, when string) {
	t.Helper()
	sent, echo, gap, err := s.state()
	if err != nil {
		t.Fatalf("the stream broke %s: %v (sent %d, echoed %d)", when, err, sent, echo)
	}
	if gap > time.Second {
		t.Fatalf("the stream stalled %s: %s without an echo (sent %d, echoed %d)", when, gap.Round(time.Millisecond), sent, echo)
	}
}

func (s *stream) close() {
	close(s.stop)
	_ = s.client.Close()
	_ = s.ln.Close()
	s.done.Wait()
}

// dialsIn reports whether a TCP connection from n to addr is accepted
// within a second.
func dialsIn(n ns.NetNS, addr string) bool { return dialsWithin(n, addr, time.Second) }

// dialsWithin reports whether a TCP connection from n to addr is accepted
// within timeout.
func dialsWithin(n ns.NetNS, addr string, timeout time.Duration) bool {
	ok := false
	_ = n.Do(func(ns.NetNS) error {
		conn, err := net.DialTimeout("tcp", addr, timeout)
		if err == nil {
			ok = true
			conn.Close()
		}
		return nil
	})
	return ok
}

// denyWhileDown tries connections from netns from to addr (a pod behind a
// default-deny policy on node) until the killed agent (pid) answers on
// socket again or 15 s pass, and returns how many were refused while the
// agent was down: an attempt counts only if the agent did not answer
// before and after it. An accepted connection fails the test. Each time,
// probe (if not nil) runs too, and its successes while the agent was down
// before and after it are counted in served; its error fails the test.
func denyWhileDown(t *testing.T, node *Node, pid int, socket string, killed time.Time, from ns.NetNS, addr, server, client string, probe func() error) (denied, served int) {
	t.Helper()
	for time.Since(killed) < 15*time.Second {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			// The killed process is reaped by its shim in a moment.
			time.Sleep(20 * time.Millisecond)
			continue
		}
		if agentAnswers(socket) {
			break
		}
		accepted := dialsWithin(from, addr, 300*time.Millisecond)
		down := !agentAnswers(socket)
		if accepted {
			t.Fatalf("%s reached %s (node %s) through the default-deny policy %s after the agent was killed (agent down: %v)",
				server, client, node.Name, time.Since(killed).Round(time.Millisecond), down)
		}
		if !down {
			break
		}
		denied++
		if probe == nil {
			continue
		}
		if err := probe(); err != nil {
			t.Fatalf("with node %s's agent killed %s ago (down: %v): %v", node.Name, time.Since(killed).Round(time.Millisecond), !agentAnswers(socket), err)
		}
		if !agentAnswers(socket) {
			served++
		}
	}
	return denied, served
}

// agentAnswers reports whether the agent answers on its API socket.
func agentAnswers(socket string) bool {
	cl := client.New(socket)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	_, err := cl.GetHealthz(ctx)
	return err == nil
}

// checkAgentKill SIGKILLs the agent of node (the process of the cellium-agent
// container of its DaemonSet pod) while a TCP stream runs from pod client
// (on node) to pod server (on another node), with a default-deny ingress
// policy on client: the stream carries on while the agent is down and
// after it is back; a new connection to client (from server) is refused
// while the agent is down; the kubelet restarts the agent, which becomes
// Ready again; the deny still holds after.
//
// With kpr (kube-proxy replacement, no kube-proxy), NodePort traffic
// through node goes on too: a stream from this machine through node's
// NodePort to server (on the other node, SNAT by node) carries on, and new
// connections to checkNodePorts' Service through node are served while
// the agent is down, from the maps it left pinned.
func checkAgentKill(t *testing.T, c *Cluster, node *Node, netnsOf map[string]ns.NetNS, ips map[string]string, client, server string, kpr bool) {
	t.Helper()
	ctx := t.Context()
	cs := c.Control.Clientset()
	s, err := startStream(netnsOf[server], netnsOf[client], net.JoinHostPort(ips[server], fmt.Sprint(streamPort)), net.JoinHostPort(ips[server], fmt.Sprint(streamPort)))
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	var np *stream
	var probe func() error
	if kpr {
		np = startNodePortStream(t, c, node, netnsOf[server], server, ips[server])
		defer np.close()
		host, err := ns.GetCurrentNS()
		if err != nil {
			t.Fatal(err)
		}
		defer host.Close()
		addr := net.JoinHostPort(node.IP.String(), fmt.Sprint(nodePortCluster))
		probe = func() error {
			body, err := httpGetPathIn(host, addr, "/")
			if err != nil {
				return fmt.Errorf("a new connection to NodePort %s: %w", addr, err)
			}
			if body != "hello from "+server+"\n" {
				return fmt.Errorf("NodePort %s answered %q", addr, body)
			}
			return nil
		}
	}
	checkStreams := func(when string) {
		t.Helper()
		s.check(t, when)
		if np != nil {
			np.check(t, when+" (the NodePort stream)")
		}
	}
	time.Sleep(time.Second)
	checkStreams("before the kill")

	pods, err := cs.CoreV1().Pods(install.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=agent",
		FieldSelector: "spec.nodeName=" + node.Name})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("node %s's agent pod: %v (%d pods)", node.Name, err, len(pods.Items))
	}
	agentPod := pods.Items[0].Name
	restarts := func(p *corev1.Pod) int32 {
		for _, st := range p.Status.ContainerStatuses {
			if st.Name == AgentDaemonSet {
				return st.RestartCount
			}
		}
		return -1
	}
	before := restarts(&pods.Items[0])
	socket := node.AgentConfig().SocketPath()
	if !agentAnswers(socket) {
		t.Fatalf("node %s's agent does not answer on %s before the kill", node.Name, socket)
	}
	// The kubelet restarts a killed container at once the first time, and
	// the agent answers again within a second or two: if no attempt fell
	// in that window, kill it again (the kubelet's crash back-off makes
	// the next window about ten seconds long).
	var killed time.Time
	deniedWhileDown, servedWhileDown := 0, 0
	for kill := 1; deniedWhileDown == 0 || (kpr && servedWhileDown == 0); kill++ {
		if kill > 3 {
			t.Fatalf("the agent of node %s was back each time before a connection attempt could be made while it was down (%d kills)", node.Name, kill-1)
		}
		if kill > 1 {
			eventually(t, time.Minute, "node "+node.Name+"'s agent answers before the next kill", func() error {
				if !agentAnswers(socket) {
					return fmt.Errorf("no answer on %s", socket)
				}
				return nil
			})
		}
		pid := containerPID(t, node, install.Namespace, agentPod, AgentDaemonSet)
		killed = time.Now()
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatalf("kill the agent (pid %d): %v", pid, err)
		}
		t.Logf("node %s: agent (pid %d) killed (kill %d)", node.Name, pid, kill)
		deniedWhileDown, servedWhileDown = denyWhileDown(t, node, pid, socket, killed, netnsOf[server], net.JoinHostPort(ips[client], "8080"), server, client, probe)
	}
	checkStreams("while the agent was down")
	t.Logf("node %s: %d connection attempts denied while the agent was down; the stream ran on", node.Name, deniedWhileDown)
	if kpr {
		t.Logf("node %s: %d new NodePort connections served while its agent was down; the NodePort stream ran on", node.Name, servedWhileDown)
	}

	// The kubelet restarts the agent, which becomes Ready.
	eventually(t, 2*time.Minute, "node "+node.Name+"'s agent restarted and Ready", func() error {
		checkStreams("while the agent restarted")
		p, err := cs.CoreV1().Pods(install.Namespace).Get(ctx, agentPod, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if n := restarts(p); n <= before || !podReady(p) {
			return fmt.Errorf("restarts %d (before %d), ready %v", n, before, podReady(p))
		}
		if !agentAnswers(socket) {
			return fmt.Errorf("no answer on %s", socket)
		}
		return nil
	})
	t.Logf("node %s: agent back and Ready %s after the kill", node.Name, time.Since(killed).Round(time.Millisecond))
	// The stream carries on with the agent back, and the deny holds.
	time.Sleep(2 * time.Second)
	checkStreams("after the agent came back")
	if dialsIn(netnsOf[server], net.JoinHostPort(ips[client], "8080")) {
		t.Fatalf("%s reached %s through the default-deny policy after the agent came back", server, client)
	}
	sent, echo, gap, _ := s.state()
	t.Logf("the stream: %d bytes sent, %d echoed, longest gap %s", sent, echo, gap.Round(time.Millisecond))
	if np != nil {
		sent, echo, gap, _ := np.state()
		t.Logf("the NodePort stream: %d bytes sent, %d echoed, longest gap %s", sent, echo, gap.Round(time.Millisecond))
	}
}

// startNodePortStream creates a NodePort Service (externalTrafficPolicy
// Cluster) in front of pod server's nodePortStreamPort and starts a stream
// from this machine through node's NodePort to it.
func startNodePortStream(t *testing.T, c *Cluster, node *Node, serverNS ns.NetNS, server, serverIP string) *stream {
	t.Helper()
	ctx := t.Context()
	p, err := c.Control.Clientset().CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: "status.podIP=" + serverIP})
	if err != nil || len(p.Items) != 1 {
		t.Fatalf("pod %s at %s: %v (%d pods)", server, serverIP, err, len(p.Items))
	}
	space := p.Items[0].Namespace
	_, err = c.Control.Clientset().CoreV1().Services(space).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "np-stream"},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeNodePort,
			Selector: map[string]string{"app": server},
			Ports: []corev1.ServicePort{{Name: "stream", Port: nodePortStreamPort, TargetPort: intstr.FromInt32(nodePortStreamPort),
				NodePort: nodePortStream}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("service np-stream: %v", err)
	}
	host, err := ns.GetCurrentNS()
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	listen := net.JoinHostPort(serverIP, fmt.Sprint(nodePortStreamPort))
	dial := net.JoinHostPort(node.IP.String(), fmt.Sprint(nodePortStream))
	var s *stream
	eventually(t, 30*time.Second, "a stream from this machine through NodePort "+dial, func() error {
		s, err = startStream(serverNS, host, listen, dial)
		return err
	})
	return s
}
