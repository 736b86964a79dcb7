package e2e

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"regexp"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// whoPort is where serveName answers with the pod's name.
const whoPort = 8081

// serveName answers every TCP connection and UDP datagram to ip:whoPort
// inside n with name (like agnhost's /hostname), until the test ends.
func serveName(t *testing.T, n ns.NetNS, ip netip.Addr, name string) {
	t.Helper()
	addr := netip.AddrPortFrom(ip, whoPort).String()
	var ln net.Listener
	var pc net.PacketConn
	if err := n.Do(func(ns.NetNS) error {
		var err error
		if ln, err = net.Listen("tcp4", addr); err != nil {
			return err
		}
		pc, err = net.ListenPacket("udp4", addr)
		return err
	}); err != nil {
		if ln != nil {
			ln.Close()
		}
		t.Fatalf("serve %s on %s: %v", name, addr, err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte(name))
			c.Close()
		}
	})
	wg.Go(func() {
		buf := make([]byte, 64)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo([]byte(name), from)
		}
	})
	t.Cleanup(func() { ln.Close(); pc.Close(); wg.Wait() })
}

// askNames sends n TCP connections, or n datagrams from one unconnected
// UDP socket, from src to dst and returns the names that answered.
func askNames(src ns.NetNS, proto string, dst netip.AddrPort, n int) ([]string, error) {
	var names []string
	err := src.Do(func(ns.NetNS) error {
		deadline := time.Now().Add(5 * time.Second)
		if proto == "tcp" {
			for range n {
				c, err := (&net.Dialer{Deadline: deadline}).Dial("tcp4", dst.String())
				if err != nil {
					return err
				}
				_ = c.SetDeadline(deadline)
				b, err := io.ReadAll(c)
				c.Close()
				if err != nil {
					return err
				}
				names = append(names, string(b))
			}
			return nil
		}
		pc, err := net.ListenPacket("udp4", ":0")
		if err != nil {
			return err
		}
		defer pc.Close()
		_ = pc.SetDeadline(deadline)
		buf := make([]byte, 64)
		for range n {
			if _, err := pc.WriteTo([]byte("?"), net.UDPAddrFromAddrPort(dst)); err != nil {
				return err
			}
			m, from, err := pc.ReadFrom(buf)
			if err != nil {
				return err
			}
			if from.String() != dst.String() {
				return fmt.Errorf("answer from %s, want %s", from, dst)
			}
			names = append(names, string(buf[:m]))
		}
		return nil
	})
	return names, err
}

func distinctNames(names []string) []string {
	out := slices.Clone(names)
	slices.Sort(out)
	return slices.Compact(out)
}

// TestPrivilegedSocketLBSessionAffinity plays Kubernetes' conformance specs
// "should have session affinity work for service with type clusterIP" and
// "should be able to switch session affinity for service with type
// clusterIP" against the socket load balancer: a Service with
// sessionAffinity ClientIP in front of three pods; 30 TCP connections and
// 30 UDP datagrams from pod a all reach one pod; `cellium service list`
// shows the affinity; switched to None, they spread over several pods;
// switched back, they stick again.
func TestPrivilegedSocketLBSessionAffinity(t *testing.T) {
	e := newEnv(t, envOptions{hostRouting: true, bpf: true, socketLB: true})
	blackhole(t, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(100 + cidrs.Load()), 0, 0}), 16))
	blackhole(t, serviceRange)
	names := []string{"a", "b1", "b2", "b3"}
	peers := e.dpPods(names)
	for _, n := range names[1:] {
		serveName(t, peers[n].netns, peers[n].ip, n)
	}
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	services := e.cs.CoreV1().Services(e.ns)
	svc, err := services.Create(e.ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "who", Namespace: e.ns},
		Spec: corev1.ServiceSpec{
			SessionAffinity: corev1.ServiceAffinityClientIP,
			Ports: []corev1.ServicePort{
				{Name: "tcp", Protocol: tcp, Port: svcPort, TargetPort: intstr.FromInt32(whoPort)},
				{Name: "udp", Protocol: udp, Port: svcPort, TargetPort: intstr.FromInt32(whoPort)},
			}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c := svc.Spec.SessionAffinityConfig; c == nil || c.ClientIP == nil || c.ClientIP.TimeoutSeconds == nil || *c.ClientIP.TimeoutSeconds != 10800 {
		t.Fatalf("the API server did not default the affinity timeout: %+v", svc.Spec.SessionAffinityConfig)
	}
	vip := netip.AddrPortFrom(netip.MustParseAddr(svc.Spec.ClusterIP), svcPort)
	ready := true
	port := int32(whoPort)
	var eps []discoveryv1.Endpoint
	for _, n := range names[1:] {
		eps = append(eps, discoveryv1.Endpoint{Addresses: []string{peers[n].ip.String()}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}})
	}
	if _, err := e.cs.DiscoveryV1().EndpointSlices(e.ns).Create(e.ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "who-1", Namespace: e.ns, Labels: map[string]string{discoveryv1.LabelServiceName: "who"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   eps,
		Ports:       []discoveryv1.EndpointPort{{Name: ptrTo("tcp"), Protocol: &tcp, Port: &port}, {Name: ptrTo("udp"), Protocol: &udp, Port: &port}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	a := peers["a"].netns
	const n = 30
	// sticky checks that n connections and n datagrams each reach one pod.
	sticky := func(what string) error {
		for _, proto := range []string{"tcp", "udp"} {
			got, err := askNames(a, proto, vip, n)
			if err != nil {
				return fmt.Errorf("%s: %s to %s: %w", what, proto, vip, err)
			}
			if d := distinctNames(got); len(d) != 1 {
				return fmt.Errorf("%s: %d %s exchanges with %s reached %v, want one pod", what, n, proto, vip, d)
			}
		}
		return nil
	}
	eventually(t, 30*time.Second, "a sticks to one pod behind the ClusterIP", func() error { return sticky("ClientIP") })
	first, _ := askNames(a, "tcp", vip, 1)
	t.Logf("sessionAffinity ClientIP: %d TCP connections and %d datagrams from a to %s reached one pod (%v)", n, n, vip, first)
	out, err := exec.CommandContext(e.ctx, cliBinary(t), "-H", "unix://"+e.node.AgentConfig().SocketPath(), "service", "list").CombinedOutput()
	if err != nil {
		t.Fatalf("cellium service list: %v\n%s", err, out)
	}
	if want := regexp.MustCompile(regexp.QuoteMeta(vip.String()+"/TCP") + ` +ClusterIP +` + regexp.QuoteMeta(e.ns+"/who:tcp") + ` +ClientIP 10800s +\d+ => `); !want.Match(out) {
		t.Errorf("cellium service list lacks the affinity of %s:\n%s", vip, out)
	}

	// switchTo sets the Service's session affinity.
	switchTo := func(aff corev1.ServiceAffinity) {
		t.Helper()
		cur, err := services.Get(e.ctx, "who", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cur.Spec.SessionAffinity = aff
		if aff == corev1.ServiceAffinityNone {
			cur.Spec.SessionAffinityConfig = nil
		}
		if _, err := services.Update(e.ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	switchTo(corev1.ServiceAffinityNone)
	eventually(t, 30*time.Second, "a spreads over the pods with sessionAffinity None", func() error {
		for _, proto := range []string{"tcp", "udp"} {
			got, err := askNames(a, proto, vip, n)
			if err != nil {
				return err
			}
			if d := distinctNames(got); len(d) < 2 {
				return fmt.Errorf("%d %s exchanges reached only %v", n, proto, d)
			}
		}
		return nil
	})
	t.Logf("sessionAffinity None: a's exchanges reach several pods")
	switchTo(corev1.ServiceAffinityClientIP)
	eventually(t, 30*time.Second, "a sticks again with sessionAffinity ClientIP", func() error { return sticky("ClientIP again") })
	if err := services.Delete(e.ctx, "who", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}
