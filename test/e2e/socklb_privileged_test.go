package e2e

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	api "github.com/cellium/cellium/api/policy"
	"github.com/cellium/cellium/datapath/socklb"
)

// svcPort is the Service port in front of the pods' dpPort.
const svcPort = 80

// svcExchange does one exchange with dst from n: "tcp" (connect, echo),
// "udp" (connected UDP, echo) or "udpto" (unconnected UDP: sendto,
// recvfrom). It returns whether the echo came back, the peer the socket
// shows (getpeername for tcp/udp, the datagram's source for udpto) and
// the errno of a refused connect.
func svcExchange(n ns.NetNS, kind string, dst netip.AddrPort, timeout time.Duration) (ok bool, peer string, errno syscall.Errno, err error) {
	err = n.Do(func(ns.NetNS) error {
		deadline := time.Now().Add(timeout)
		msg := []byte("cellium socket lb probe")
		got := make([]byte, len(msg))
		switch kind {
		case "tcp", "udp":
			c, err := (&net.Dialer{Deadline: deadline}).Dial(kind+"4", dst.String())
			if err != nil {
				if errors.As(err, &errno) || isTimeout(err) {
					return nil
				}
				return err
			}
			defer c.Close()
			peer = c.RemoteAddr().String()
			_ = c.SetDeadline(deadline)
			if _, err := c.Write(msg); err != nil {
				return nil
			}
			if _, err := io.ReadFull(c, got); err != nil {
				return nil
			}
		case "udpto":
			pc, err := net.ListenPacket("udp4", ":0")
			if err != nil {
				return err
			}
			defer pc.Close()
			_ = pc.SetDeadline(deadline)
			if _, err := pc.WriteTo(msg, net.UDPAddrFromAddrPort(dst)); err != nil {
				if errors.As(err, &errno) {
					return nil
				}
				return err
			}
			_, from, err := pc.ReadFrom(got)
			if err != nil {
				return nil
			}
			peer = from.String()
		default:
			return fmt.Errorf("unknown kind %s", kind)
		}
		ok = string(got) == string(msg)
		return nil
	})
	return ok, peer, errno, err
}

// TestPrivilegedSocketLB: with the eBPF datapath and the socket load
// balancer on, pod a reaches pod b through a Service's ClusterIP (a
// Service without selector and an EndpointSlice naming b, as the
// endpointslice controller would write it) over TCP, connected UDP and
// unconnected UDP, and sees the ClusterIP as its peer. The packets leave
// a already addressed to b, so egress policy sees the real destination:
// a CNP allowing a's egress only to app=b on the target port lets the
// ClusterIP traffic pass (the ClusterIP itself is world to the ipcache),
// and an egress deny of app=b drops it with "Policy denied by denylist"
// events whose destination is b's address, never the ClusterIP. Without
// ready endpoints, connect() to the ClusterIP fails at once with
// EHOSTUNREACH. The Service range is blackholed in the host, so an
// untranslated packet never leaves the machine.
func TestPrivilegedSocketLB(t *testing.T) {
	e := newEnv(t, envOptions{hostRouting: true, bpf: true, socketLB: true})
	blackhole(t, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(100 + cidrs.Load()), 0, 0}), 16))
	blackhole(t, serviceRange)
	peers := e.dpPods([]string{"a", "b", "c"})
	a, b, c := peers["a"], peers["b"], peers["c"]

	// The programs are attached, their links pinned under the bpffs.
	linkDir := filepath.Join(e.node.AgentConfig().BPFRoot(), "cellium", "socklb")
	eventually(t, 30*time.Second, "socket LB links pinned", func() error {
		names, err := socklb.Attached(linkDir)
		if err != nil || len(names) != len(socklb.Programs) {
			return fmt.Errorf("pinned %v (%v), want %d links", names, err, len(socklb.Programs))
		}
		return nil
	})

	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	svc, err := e.cs.CoreV1().Services(e.ns).Create(e.ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "b-svc", Namespace: e.ns},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{
			{Name: "tcp", Protocol: tcp, Port: svcPort, TargetPort: intstr.FromInt32(dpPort)},
			{Name: "udp", Protocol: udp, Port: svcPort, TargetPort: intstr.FromInt32(dpPort)},
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	clusterIP := netip.MustParseAddr(svc.Spec.ClusterIP)
	if !serviceRange.Contains(clusterIP) {
		t.Fatalf("ClusterIP %s outside the test's Service range %s", clusterIP, serviceRange)
	}
	vip := netip.AddrPortFrom(clusterIP, svcPort)
	ready := true
	port := int32(dpPort)
	slices_ := e.cs.DiscoveryV1().EndpointSlices(e.ns)
	if _, err := slices_.Create(e.ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "b-svc-1", Namespace: e.ns, Labels: map[string]string{discoveryv1.LabelServiceName: "b-svc"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{b.ip.String()}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
		Ports: []discoveryv1.EndpointPort{
			{Name: ptrTo("tcp"), Protocol: &tcp, Port: &port},
			{Name: ptrTo("udp"), Protocol: &udp, Port: &port},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// exchange checks that every kind reaches b through the ClusterIP
	// and shows the ClusterIP as the peer.
	exchange := func(what string) error {
		for _, kind := range []string{"tcp", "udp", "udpto"} {
			ok, peer, errno, err := svcExchange(a.netns, kind, vip, 1500*time.Millisecond)
			if err != nil {
				return fmt.Errorf("%s: %s to %s: %w", what, kind, vip, err)
			}
			if !ok || peer != vip.String() {
				return fmt.Errorf("%s: %s to %s: echoed %v, peer %q (errno %v), want the echo from %s", what, kind, vip, ok, peer, errno, vip)
			}
		}
		return nil
	}
	eventually(t, 30*time.Second, "a reaches b through the ClusterIP", func() error { return exchange("default-allow") })
	t.Logf("a -> %s (b %s): TCP, UDP and unconnected UDP answered by b, peer shown as the ClusterIP", vip, b.ip)
	// `cellium service list` shows both frontends with b as backend.
	out, err := exec.CommandContext(e.ctx, cliBinary(t), "-H", "unix://"+e.node.AgentConfig().SocketPath(), "service", "list").CombinedOutput()
	if err != nil {
		t.Fatalf("cellium service list: %v\n%s", err, out)
	}
	for _, proto := range []string{"TCP", "UDP"} {
		want := regexp.MustCompile(regexp.QuoteMeta(vip.String()+"/"+proto) + ` +ClusterIP +` + regexp.QuoteMeta(e.ns+"/b-svc:"+strings.ToLower(proto)) +
			` +None +\d+ => ` + regexp.QuoteMeta(netip.AddrPortFrom(b.ip, dpPort).String()+"/"+proto) + ` +Done`)
		if !want.Match(out) {
			t.Errorf("cellium service list lacks %s -> b on %s:\n%s", vip, proto, out)
		}
	}

	// The links are pinned: the ClusterIP works while the agent is down,
	// and after it is back (its programs swapped into the same links).
	if err := e.node.StopAgent(); err != nil {
		t.Fatal(err)
	}
	if err := exchange("agent stopped"); err != nil {
		t.Fatal(err)
	}
	if err := e.node.StartAgent(e.ctx); err != nil {
		t.Fatal(err)
	}
	if err := exchange("agent restarted"); err != nil {
		t.Fatal(err)
	}
	if names, err := socklb.Attached(linkDir); err != nil || len(names) != len(socklb.Programs) {
		t.Fatalf("after the restart: pinned %v (%v), want %d links", names, err, len(socklb.Programs))
	}
	// The restarted agent's drop events.
	drops := e.watchDrops()

	// a's egress is allowed only to app=b on the target port: the
	// ClusterIP traffic passes (its packets go to b), a -> c does not.
	cnps := e.cilium.CiliumV2().CiliumNetworkPolicies(e.ns)
	sel := func(app string) api.EndpointSelector {
		return api.EndpointSelector{MatchLabels: map[string]string{"app": app}}
	}
	selp := func(app string) *api.EndpointSelector { s := sel(app); return &s }
	if _, err := cnps.Create(e.ctx, &ciliumv2.CiliumNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "a-to-b", Namespace: e.ns},
		Spec: &api.Rule{EndpointSelector: selp("a"), Egress: []api.EgressRule{{
			EgressCommonRule: api.EgressCommonRule{ToEndpoints: []api.EndpointSelector{sel("b")}},
			ToPorts: api.PortRules{{Ports: []api.PortProtocol{
				{Port: fmt.Sprint(dpPort), Protocol: api.ProtoTCP}, {Port: fmt.Sprint(dpPort), Protocol: api.ProtoUDP}}}},
		}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	since := time.Now()
	eventually(t, 30*time.Second, "a -> c denied by a's egress policy", func() error {
		if ok, _, _, err := svcExchange(a.netns, "udp", netip.AddrPortFrom(c.ip, dpPort), 300*time.Millisecond); err != nil || ok {
			return fmt.Errorf("a -> c/udp still answered (%v)", err)
		}
		return nil
	})
	if _, ok := drops.wait(since, 10*time.Second, policyDrop(a.ep, dropPolicy, a.ip, c.ip, "udp")); !ok {
		t.Fatal("a-to-b: no policy drop of a -> c/udp at a")
	}
	if err := exchange("a-to-b"); err != nil {
		t.Fatalf("ClusterIP traffic denied although a may reach b: %v", err)
	}

	// An egress deny of app=b (all else allowed): the ClusterIP traffic
	// drops, as traffic to b, at a.
	if err := cnps.Delete(e.ctx, "a-to-b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cnps.Create(e.ctx, &ciliumv2.CiliumNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "a-deny-b", Namespace: e.ns},
		Spec: &api.Rule{EndpointSelector: selp("a"),
			Egress:     []api.EgressRule{{EgressCommonRule: api.EgressCommonRule{ToEntities: api.EntitySlice{api.EntityAll}}}},
			EgressDeny: []api.EgressDenyRule{{EgressCommonRule: api.EgressCommonRule{ToEndpoints: []api.EndpointSelector{sel("b")}}}},
		}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	since = time.Now()
	eventually(t, 30*time.Second, "ClusterIP traffic to b denied", func() error {
		for _, kind := range []string{"tcp", "udp"} {
			if ok, _, _, err := svcExchange(a.netns, kind, vip, 300*time.Millisecond); err != nil || ok {
				return fmt.Errorf("%s to %s still answered (%v)", kind, vip, err)
			}
		}
		return nil
	})
	for _, proto := range []string{"tcp", "udp"} {
		if _, ok := drops.wait(since, 10*time.Second, policyDrop(a.ep, dropPolicyDeny, a.ip, b.ip, proto)); !ok {
			t.Errorf("a-deny-b: no %q drop of %s -> %s/%s (the real destination) at endpoint %d", "Policy denied by denylist", a.ip, b.ip, proto, a.ep)
		}
	}
	drops.mu.Lock()
	for _, s := range drops.events {
		if s.ev.DstIP == clusterIP.String() {
			t.Errorf("a drop event names the ClusterIP as destination: %+v", s.ev)
		}
	}
	drops.mu.Unlock()
	// a still reaches c: only b is denied.
	if ok, _, _, err := svcExchange(a.netns, "tcp", netip.AddrPortFrom(c.ip, dpPort), 1500*time.Millisecond); err != nil || !ok {
		t.Errorf("a-deny-b: a -> c/tcp not answered (%v)", err)
	}
	if err := cnps.Delete(e.ctx, "a-deny-b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "a reaches b through the ClusterIP again", func() error { return exchange("no policy") })

	// No ready endpoint: connect() fails at once with EHOSTUNREACH.
	if err := slices_.Delete(e.ctx, "b-svc-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "connect to a Service without endpoints refused", func() error {
		start := time.Now()
		ok, _, errno, err := svcExchange(a.netns, "tcp", vip, 1500*time.Millisecond)
		if err != nil {
			return err
		}
		if ok || errno != syscall.EHOSTUNREACH || time.Since(start) > time.Second {
			return fmt.Errorf("connect to %s: answered %v, errno %v after %s; want EHOSTUNREACH at once", vip, ok, errno, time.Since(start))
		}
		return nil
	})
	// Turned off (--bpf-lb-sock=false): the agent detaches the programs
	// at start; the ClusterIP is an ordinary (blackholed) address again.
	if err := e.node.StopAgent(); err != nil {
		t.Fatal(err)
	}
	e.node.SetSocketLB(false)
	if err := e.node.StartAgent(e.ctx); err != nil {
		t.Fatal(err)
	}
	if names, err := socklb.Attached(linkDir); err != nil || len(names) != 0 {
		t.Fatalf("--bpf-lb-sock=false: still pinned %v (%v)", names, err)
	}
	ok, _, errno, err := svcExchange(a.netns, "tcp", vip, 500*time.Millisecond)
	if err != nil || ok || errno == syscall.EHOSTUNREACH {
		t.Errorf("--bpf-lb-sock=false: connect to %s answered %v, errno %v (%v); want it untranslated into the blackhole", vip, ok, errno, err)
	}
	if err := e.cs.CoreV1().Services(e.ns).Delete(e.ctx, "b-svc", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

func ptrTo[T any](v T) *T { return &v }
