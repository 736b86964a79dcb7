package e2e

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	api "github.com/cellium/cellium/api/policy"
	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/datapath/maps"
)

// dpPort is the port every server of the datapath tests listens on, TCP
// and UDP.
const dpPort = 8080

// dpProtos are the protocols of the matrix.
var dpProtos = []string{"tcp", "udp", "icmp"}

// dpPeer is one end of the datapath matrix: a pod, the host (router IP)
// or the outside world.
type dpPeer struct {
	name  string
	netns ns.NetNS
	ip    netip.Addr
	// ep is the endpoint ID of a pod, 0 otherwise.
	ep uint16
	// trace is the peer as /v1/policy/trace takes it (identity or cidr).
	traceKey, traceVal string
}

// dpWorld is the outside world: a namespace behind a veth from the host,
// with no route back to the pods (their traffic reaches it only
// masqueraded).
type dpWorld struct {
	netns  ns.NetNS
	hostIP netip.Addr
	ip     netip.Addr
}

// blackhole adds a blackhole route for p in the host (so that nothing of
// the test range ever leaves the machine) and removes it when the test
// ends.
func blackhole(t *testing.T, p netip.Prefix) {
	t.Helper()
	r := &netlink.Route{Dst: prefixNet(p), Type: syscall.RTN_BLACKHOLE, Table: syscall.RT_TABLE_MAIN}
	if err := netlink.RouteAdd(r); err != nil {
		t.Fatalf("blackhole %s: %v", p, err)
	}
	t.Cleanup(func() {
		if err := netlink.RouteDel(r); err != nil {
			t.Errorf("remove blackhole %s: %v", p, err)
		}
	})
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// newWorld makes the outside-world namespace: host veth cdw<x> with
// 10.253.X.1/30, the world's end with 10.253.X.2/30, after a blackhole
// for 10.253.X.0/24.
func newWorld(t *testing.T) *dpWorld {
	t.Helper()
	x := byte(os.Getpid()%200) + 20
	blackhole(t, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 253, x, 0}), 24))
	w := &dpWorld{hostIP: netip.AddrFrom4([4]byte{10, 253, x, 1}), ip: netip.AddrFrom4([4]byte{10, 253, x, 2})}
	n, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	w.netns = n
	t.Cleanup(func() {
		_ = n.Close()
		_ = testutils.UnmountNS(n)
	})
	suffix := strings.ToLower(rand.Text()[:6])
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "cdw" + suffix}, PeerName: "cdwp" + suffix,
		PeerNamespace: netlink.NsFd(int(n.Fd()))}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatalf("world veth: %v", err)
	}
	t.Cleanup(func() { _ = netlink.LinkDel(veth) })
	if err := netlink.AddrAdd(veth, &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(w.hostIP, 30))}); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(veth); err != nil {
		t.Fatal(err)
	}
	err = n.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("cdwp" + suffix)
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(w.ip, 30))}); err != nil {
			return err
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	})
	if err != nil {
		t.Fatalf("world namespace: %v", err)
	}
	return w
}

// serve runs a TCP and a UDP echo server on ip:dpPort inside n until the
// test ends.
func serve(t *testing.T, n ns.NetNS, ip netip.Addr) {
	t.Helper()
	addr := netip.AddrPortFrom(ip, dpPort).String()
	var ln net.Listener
	var pc net.PacketConn
	err := n.Do(func(ns.NetNS) error {
		var err error
		if ln, err = net.Listen("tcp4", addr); err != nil {
			return err
		}
		pc, err = net.ListenPacket("udp4", addr)
		return err
	})
	if err != nil {
		if ln != nil {
			ln.Close()
		}
		t.Fatalf("serve on %s: %v", addr, err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn // closed when the test ends (streams last)
	wg.Add(2)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	go func() {
		defer wg.Done()
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo(buf[:n], from)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		pc.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
}

// probe reports whether one exchange of proto from n to dst gets its
// answer within timeout: a TCP connection echoing a message, a UDP
// datagram echoed, an ICMP echo reply. Each probe is a new flow (new
// source port or echo id).
func probe(n ns.NetNS, proto string, dst netip.Addr, timeout time.Duration) (bool, error) {
	return probePort(n, proto, netip.AddrPortFrom(dst, dpPort), timeout)
}

// probePort is probe to dst's port (TCP and UDP; ICMP ignores it).
func probePort(n ns.NetNS, proto string, dst netip.AddrPort, timeout time.Duration) (bool, error) {
	var ok bool
	err := n.Do(func(ns.NetNS) error {
		deadline := time.Now().Add(timeout)
		switch proto {
		case "tcp", "udp":
			c, err := (&net.Dialer{Deadline: deadline}).Dial(proto+"4", dst.String())
			if err != nil {
				if errors.Is(err, os.ErrDeadlineExceeded) || isTimeout(err) {
					return nil
				}
				return err
			}
			defer c.Close()
			_ = c.SetDeadline(deadline)
			msg := []byte("cellium datapath probe")
			if _, err := c.Write(msg); err != nil {
				return nil
			}
			got := make([]byte, len(msg))
			if _, err := io.ReadFull(c, got); err != nil {
				return nil
			}
			ok = string(got) == string(msg)
			return nil
		case "icmp":
			var err error
			ok, err = ping(dst.Addr(), deadline)
			return err
		}
		return fmt.Errorf("unknown protocol %s", proto)
	})
	return ok, err
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// ping sends ICMP echo requests with a random id to dst (in the calling
// thread's namespace) until a reply comes or the deadline passes.
func ping(dst netip.Addr, deadline time.Time) (bool, error) {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_RAW|syscall.SOCK_CLOEXEC, syscall.IPPROTO_ICMP)
	if err != nil {
		return false, fmt.Errorf("raw socket: %w", err)
	}
	defer syscall.Close(fd)
	tv := syscall.Timeval{Usec: 50_000}
	if err := syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &tv); err != nil {
		return false, err
	}
	var idb [2]byte
	_, _ = rand.Read(idb[:])
	id := binary.BigEndian.Uint16(idb[:])
	d4 := dst.As4()
	buf := make([]byte, 1500)
	for seq := uint16(1); time.Now().Before(deadline); seq++ {
		if err := syscall.Sendto(fd, echoRequest(id, seq), 0, &syscall.SockaddrInet4{Addr: d4}); err != nil {
			return false, fmt.Errorf("send: %w", err)
		}
		for sent := time.Now(); time.Since(sent) < 300*time.Millisecond && time.Now().Before(deadline); {
			n, _, err := syscall.Recvfrom(fd, buf, 0)
			if errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EINTR) {
				continue
			}
			if err != nil {
				return false, fmt.Errorf("receive: %w", err)
			}
			pkt := buf[:n]
			if len(pkt) < 20 {
				continue
			}
			ihl := int(pkt[0]&0x0f) * 4
			if len(pkt) < ihl+8 || [4]byte(pkt[12:16]) != d4 {
				continue
			}
			if icmp := pkt[ihl:]; icmp[0] == 0 && binary.BigEndian.Uint16(icmp[4:]) == id {
				return true, nil
			}
		}
	}
	return false, nil
}

func echoRequest(id, seq uint16) []byte {
	msg := make([]byte, 8+16)
	msg[0] = 8
	binary.BigEndian.PutUint16(msg[4:], id)
	binary.BigEndian.PutUint16(msg[6:], seq)
	copy(msg[8:], "cellium-datapath")
	var sum uint32
	for i := 0; i < len(msg); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(msg[i:]))
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	binary.BigEndian.PutUint16(msg[2:], ^uint16(sum))
	return msg
}

// dpTrace is what /v1/policy/trace answers, as far as the test reads it.
type dpTrace struct {
	Egress  dpDirTrace `json:"egress"`
	Ingress dpDirTrace `json:"ingress"`
	Allowed bool       `json:"allowed"`
}

// dpDirTrace is one direction of a trace.
type dpDirTrace struct {
	Checked, Allowed bool
	Entry            *struct {
		Deny bool `json:"deny"`
	} `json:"entry"`
}

// Cilium's drop reasons for policy: no entry allowed the packet (133), or
// a deny entry matched it (181).
const (
	dropPolicy     = 133
	dropPolicyDeny = 181
)

// trace asks the agent what its policy says of src -> dst on proto.
func (e *env) trace(src, dst dpPeer, proto string) (dpTrace, error) {
	q := url.Values{}
	q.Set("src-"+src.traceKey, src.traceVal)
	q.Set("dst-"+dst.traceKey, dst.traceVal)
	port := fmt.Sprint(dpPort)
	if proto == "icmp" {
		port = "0"
	}
	q.Set("dport", port+"/"+strings.ToUpper(proto))
	var tr dpTrace
	err := e.agent.Do(e.ctx, http.MethodGet, "/v1/policy/trace?"+q.Encode(), nil, &tr)
	return tr, err
}

// dropLog collects the agent's drop events (GET /v1/monitor).
type dropLog struct {
	mu     sync.Mutex
	events []dropSeen
	wake   chan struct{}
}

type dropSeen struct {
	ev models.MonitorEvent
	at time.Time
}

// watchDrops streams the agent's drop events until the test ends.
func (e *env) watchDrops() *dropLog {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s, err := e.agent.Monitor(ctx, []string{"drop"}, nil)
	if err != nil {
		cancel()
		e.t.Fatalf("monitor: %v", err)
	}
	d := &dropLog{wake: make(chan struct{})}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			ev, err := s.Next()
			if err != nil {
				return
			}
			d.mu.Lock()
			d.events = append(d.events, dropSeen{ev: ev, at: time.Now()})
			close(d.wake)
			d.wake = make(chan struct{})
			d.mu.Unlock()
		}
	}()
	e.t.Cleanup(func() {
		cancel()
		_ = s.Close()
		<-done
	})
	return d
}

// wait returns the receive time of the first event after since that
// match accepts, waiting up to timeout.
func (d *dropLog) wait(since time.Time, timeout time.Duration, match func(models.MonitorEvent) bool) (time.Time, bool) {
	deadline := time.After(timeout)
	for {
		d.mu.Lock()
		for _, s := range d.events {
			if !s.at.Before(since) && match(s.ev) {
				d.mu.Unlock()
				return s.at, true
			}
		}
		wake := d.wake
		d.mu.Unlock()
		select {
		case <-wake:
		case <-deadline:
			return time.Time{}, false
		}
	}
}

// policyDrop matches a policy drop (dropPolicy, "Policy denied", or
// dropPolicyDeny, "Policy denied by denylist") of src -> dst on proto seen
// by endpoint ep.
func policyDrop(ep uint16, code uint8, src, dst netip.Addr, proto string) func(models.MonitorEvent) bool {
	reason := map[uint8]string{dropPolicy: "Policy denied", dropPolicyDeny: "Policy denied by denylist"}[code]
	return func(ev models.MonitorEvent) bool {
		return ev.ReasonCode == code && ev.Reason == reason && ev.EndpointID == ep &&
			ev.SrcIP == src.String() && ev.DstIP == dst.String() && ev.Protocol == proto
	}
}

// dpCell is one cell of the matrix.
type dpCell struct {
	src, dst dpPeer
	proto    string
}

func (c dpCell) String() string { return c.src.name + "->" + c.dst.name + "/" + c.proto }

// matrix runs every cell's probe at once and compares each outcome with
// the trace of the cell; a denied cell must have produced its policy
// drop event at the endpoint the trace says denied it. It returns the
// number of allowed and denied cells.
func (e *env) matrix(name string, cells []dpCell, drops *dropLog) (allowed, denied int) {
	e.t.Helper()
	type result struct {
		ok  bool
		err error
	}
	start := time.Now()
	results := make([]result, len(cells))
	var wg sync.WaitGroup
	for i, c := range cells {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok, err := probe(c.src.netns, c.proto, c.dst.ip, 1500*time.Millisecond)
			results[i] = result{ok, err}
		}()
	}
	wg.Wait()
	var table []string
	for i, c := range cells {
		r := results[i]
		if r.err != nil {
			e.t.Fatalf("%s: probe %s: %v", name, c, r.err)
		}
		tr, err := e.trace(c.src, c.dst, c.proto)
		if err != nil {
			e.t.Fatalf("%s: trace %s: %v", name, c, err)
		}
		verdict := map[bool]string{true: "allowed", false: "denied"}
		table = append(table, fmt.Sprintf("%-22s packet %-7s trace %s", c, verdict[r.ok], verdict[tr.Allowed]))
		if r.ok != tr.Allowed {
			e.t.Errorf("%s: %s: the packet was %s, policy trace says %s", name, c, verdict[r.ok], verdict[tr.Allowed])
			continue
		}
		if r.ok {
			allowed++
			continue
		}
		denied++
		ep, dir := c.dst.ep, tr.Ingress
		if tr.Egress.Checked && !tr.Egress.Allowed {
			ep, dir = c.src.ep, tr.Egress
		}
		code := uint8(dropPolicy)
		if dir.Entry != nil && dir.Entry.Deny {
			code = dropPolicyDeny
		}
		if _, ok := drops.wait(start, 5*time.Second, policyDrop(ep, code, c.src.ip, c.dst.ip, c.proto)); !ok {
			e.t.Errorf("%s: %s denied, but no policy drop event (reason %d) of endpoint %d", name, c, code, ep)
		}
	}
	e.t.Logf("%s:\n%s", name, strings.Join(table, "\n"))
	return allowed, denied
}

// dpCase is one policy of the matrix test: the objects it creates, and a
// UDP cell it denies that the default allows, to time enforcement with.
type dpCase struct {
	name     string
	create   func() error
	remove   func() error
	sentinel [2]string
	// egress: the sentinel is denied by its source's egress policy (else
	// by its destination's ingress); deny: by a deny rule.
	egress, deny bool
}

// TestPrivilegedDatapathPolicy: three pods run by the dev-kubelet through
// the CNI path, with the agent's host routing and eBPF datapath on; a
// matrix of TCP, UDP and ICMP between the pods, to the host (router IP)
// and to an outside-world namespace (masqueraded), under default-allow
// and five policies (a NetworkPolicy, a CNP with ports, a CNP deny, entity
// rules, a CIDR rule): every packet's fate equals `policy trace`'s
// verdict, and every denied packet produces a "Policy denied" drop event
// of the endpoint that denied it. The time from a policy's creation to
// its first denied packet is logged.
func TestPrivilegedDatapathPolicy(t *testing.T) {
	world := newWorld(t)
	e := newEnv(t, envOptions{hostRouting: true, bpf: true})
	blackhole(t, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(100 + cidrs.Load()), 0, 0}), 16))
	names := []string{"a", "b", "c"}
	peers := e.dpPods(names)
	hostNS, err := ns.GetCurrentNS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = hostNS.Close() })
	router := routerIP(t)
	peers["host"] = dpPeer{name: "host", netns: hostNS, ip: router, traceKey: "identity", traceVal: "host"}
	serve(t, hostNS, router)
	peers["world"] = dpPeer{name: "world", netns: world.netns, ip: world.ip, traceKey: "cidr", traceVal: world.ip.String()}
	serve(t, world.netns, world.ip)

	var cells []dpCell
	for _, s := range names {
		for _, d := range []string{"a", "b", "c", "host", "world"} {
			if s == d {
				continue
			}
			for _, p := range dpProtos {
				cells = append(cells, dpCell{peers[s], peers[d], p})
			}
		}
	}
	drops := e.watchDrops()

	allowed, denied := e.matrix("default-allow", cells, drops)
	if denied != 0 {
		t.Fatalf("default-allow: %d of %d cells denied", denied, allowed+denied)
	}

	tcp := corev1.ProtocolTCP
	port := intstr.FromInt32(dpPort)
	sel := func(app string) *api.EndpointSelector {
		return &api.EndpointSelector{MatchLabels: map[string]string{"app": app}}
	}
	cnps := e.cilium.CiliumV2().CiliumNetworkPolicies(e.ns)
	createCNP := func(name string, r *api.Rule) error {
		_, err := cnps.Create(e.ctx, &ciliumv2.CiliumNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns}, Spec: r}, metav1.CreateOptions{})
		return err
	}
	deleteCNPs := func(names ...string) func() error {
		return func() error {
			var errs []error
			for _, n := range names {
				errs = append(errs, cnps.Delete(e.ctx, n, metav1.DeleteOptions{}))
			}
			return errors.Join(errs...)
		}
	}
	worldCIDR := api.CIDR(world.ip.String() + "/32")
	cases := []dpCase{{
		name: "NetworkPolicy: b ingress from app=a on TCP 8080",
		create: func() error {
			_, err := e.cs.NetworkingV1().NetworkPolicies(e.ns).Create(e.ctx, &networkingv1.NetworkPolicy{
				ObjectMeta: metav1.ObjectMeta{Name: "b-from-a", Namespace: e.ns},
				Spec: networkingv1.NetworkPolicySpec{
					PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "b"}},
					Ingress: []networkingv1.NetworkPolicyIngressRule{{
						From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "a"}}}},
						Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}},
					}},
					PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
				},
			}, metav1.CreateOptions{})
			return err
		},
		remove: func() error {
			return e.cs.NetworkingV1().NetworkPolicies(e.ns).Delete(e.ctx, "b-from-a", metav1.DeleteOptions{})
		},
		sentinel: [2]string{"c", "b"},
	}, {
		name: "CNP toPorts: a egress to app=b on UDP 8080",
		create: func() error {
			return createCNP("a-to-b-udp", &api.Rule{EndpointSelector: sel("a"), Egress: []api.EgressRule{{
				EgressCommonRule: api.EgressCommonRule{ToEndpoints: []api.EndpointSelector{*sel("b")}},
				ToPorts:          api.PortRules{{Ports: []api.PortProtocol{{Port: "8080", Protocol: api.ProtoUDP}}}},
			}}})
		},
		remove:   deleteCNPs("a-to-b-udp"),
		sentinel: [2]string{"a", "c"},
		egress:   true,
	}, {
		name: "CNP ingressDeny: b allows all, denies app=c",
		create: func() error {
			return createCNP("b-deny-c", &api.Rule{EndpointSelector: sel("b"),
				Ingress:     []api.IngressRule{{IngressCommonRule: api.IngressCommonRule{FromEntities: api.EntitySlice{api.EntityAll}}}},
				IngressDeny: []api.IngressDenyRule{{IngressCommonRule: api.IngressCommonRule{FromEndpoints: []api.EndpointSelector{*sel("c")}}}},
			})
		},
		remove:   deleteCNPs("b-deny-c"),
		sentinel: [2]string{"c", "b"},
		deny:     true,
	}, {
		name: "entities: b ingress fromEntities host, a egress toEntities world",
		create: func() error {
			if err := createCNP("b-from-host", &api.Rule{EndpointSelector: sel("b"),
				Ingress: []api.IngressRule{{IngressCommonRule: api.IngressCommonRule{FromEntities: api.EntitySlice{api.EntityHost}}}},
			}); err != nil {
				return err
			}
			return createCNP("a-to-world", &api.Rule{EndpointSelector: sel("a"),
				Egress: []api.EgressRule{{EgressCommonRule: api.EgressCommonRule{ToEntities: api.EntitySlice{api.EntityWorld}}}},
			})
		},
		remove:   deleteCNPs("b-from-host", "a-to-world"),
		sentinel: [2]string{"a", "c"},
		egress:   true,
	}, {
		name: "CIDR: c egress toCIDR the world's /32",
		create: func() error {
			return createCNP("c-to-cidr", &api.Rule{EndpointSelector: sel("c"),
				Egress: []api.EgressRule{{EgressCommonRule: api.EgressCommonRule{ToCIDR: api.CIDRSlice{worldCIDR}}}},
			})
		},
		remove:   deleteCNPs("c-to-cidr"),
		sentinel: [2]string{"c", "a"},
		egress:   true,
	}}

	var latencies []time.Duration
	for _, c := range cases {
		src, dst := peers[c.sentinel[0]], peers[c.sentinel[1]]
		// The sentinel passes before the policy: the previous case is
		// lifted in the datapath.
		eventually(t, 30*time.Second, c.name+": sentinel allowed before", func() error {
			if ok, err := probe(src.netns, "udp", dst.ip, 300*time.Millisecond); err != nil || !ok {
				return fmt.Errorf("%s->%s/udp not passing (%v)", src.name, dst.name, err)
			}
			return nil
		})
		// Fire a new UDP flow at the sentinel every 5ms while the policy
		// is applied; the first drop event of it is the enforcement.
		stop := make(chan struct{})
		fired := make(chan struct{})
		go func() {
			defer close(fired)
			tk := time.NewTicker(5 * time.Millisecond)
			defer tk.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tk.C:
				}
				_ = src.netns.Do(func(ns.NetNS) error {
					c, err := net.Dial("udp4", netip.AddrPortFrom(dst.ip, dpPort).String())
					if err == nil {
						_, _ = c.Write([]byte("sentinel"))
						c.Close()
					}
					return nil
				})
			}
		}()
		if err := c.create(); err != nil {
			close(stop)
			<-fired
			t.Fatalf("%s: create: %v", c.name, err)
		}
		applied := time.Now()
		ep := dst.ep
		if c.egress {
			ep = src.ep
		}
		code := uint8(dropPolicy)
		if c.deny {
			code = dropPolicyDeny
		}
		at, ok := drops.wait(applied, 30*time.Second, policyDrop(ep, code, src.ip, dst.ip, "udp"))
		close(stop)
		<-fired
		if !ok {
			t.Fatalf("%s: no policy drop (reason %d) of %s->%s/udp at endpoint %d within 30s of applying", c.name, code, src.name, dst.name, ep)
		}
		latencies = append(latencies, at.Sub(applied))
		t.Logf("%s: enforced %s after the API returned", c.name, at.Sub(applied))
		e.matrix(c.name, cells, drops)
		if err := c.remove(); err != nil {
			t.Fatalf("%s: remove: %v", c.name, err)
		}
	}
	slices.Sort(latencies)
	t.Logf("policy applied -> first denied packet over %d cases: min %s, median %s, max %s",
		len(latencies), latencies[0], latencies[len(latencies)/2], latencies[len(latencies)-1])
}

// dpPods creates pods named names, each labelled app=<name>, waits until
// they run with ready CEPs, and returns them as peers, each serving TCP
// and UDP echo on dpPort.
func (e *env) dpPods(names []string) map[string]dpPeer {
	e.t.Helper()
	spec := map[string]map[string]string{}
	for _, n := range names {
		spec[n] = map[string]string{"app": n}
	}
	e.createPods(spec)
	pods := e.waitRunning(names, 90*time.Second)
	ceps := e.waitCEPs(pods, 60*time.Second)
	sbs := e.sandboxes()
	peers := map[string]dpPeer{}
	for _, n := range names {
		pn, err := ns.GetNS(sbs[n].NetnsPath)
		if err != nil {
			e.t.Fatal(err)
		}
		e.t.Cleanup(func() { _ = pn.Close() })
		ip := netip.MustParseAddr(pods[n].Status.PodIP)
		peers[n] = dpPeer{name: n, netns: pn, ip: ip, ep: uint16(ceps[n].Status.ID),
			traceKey: "identity", traceVal: fmt.Sprint(ceps[n].Status.Identity.ID)}
		serve(e.t, pn, ip)
	}
	return peers
}

// routerIP returns cilium_host's IPv4 address.
func routerIP(t *testing.T) netip.Addr {
	t.Helper()
	var ip netip.Addr
	eventually(t, 30*time.Second, "cilium_host's address", func() error {
		l, err := netlink.LinkByName("cilium_host")
		if err != nil {
			return err
		}
		addrs, err := netlink.AddrList(l, netlink.FAMILY_V4)
		if err != nil || len(addrs) == 0 {
			return fmt.Errorf("no IPv4 address on cilium_host (%v)", err)
		}
		ip, _ = netip.AddrFromSlice(addrs[0].IP.To4())
		return nil
	})
	return ip
}

// dpPaths is where the agent's bpffs keeps endpoint id's pins.
func dpPaths(e *env, id uint16) (linkDir, policyPin string) {
	root := filepath.Join(e.node.AgentConfig().BPFRoot(), "cellium")
	return filepath.Join(root, "endpoints", fmt.Sprint(id)), filepath.Join(root, fmt.Sprintf("cellium_policy_%05d", id))
}

// dpState is what the datapath holds of one endpoint.
type dpState struct {
	linkPins  []string // pins in the endpoint's link directory
	policyPin bool
	lxc       bool // cellium_lxc has its IP
	ipcache   bool // cellium_ipcache has its /32
	route     bool // the host has a /32 route to it
}

// datapathState reads endpoint id's (address ip) programs' pins, policy
// map pin, cellium_lxc and cellium_ipcache entries and host route.
func (e *env) datapathState(id uint16, ip netip.Addr) (dpState, error) {
	var st dpState
	linkDir, policyPin := dpPaths(e, id)
	ents, err := os.ReadDir(linkDir)
	if err != nil && !os.IsNotExist(err) {
		return st, err
	}
	for _, d := range ents {
		st.linkPins = append(st.linkPins, d.Name())
	}
	if _, err := os.Stat(policyPin); err == nil {
		st.policyPin = true
	}
	m, err := maps.Open(filepath.Join(e.node.AgentConfig().BPFRoot(), "cellium"))
	if err != nil {
		return st, err
	}
	defer m.Close()
	if _, err := m.Endpoints.Lookup(ip); err == nil {
		st.lxc = true
	} else if !errors.Is(err, ebpf.ErrKeyNotExist) {
		return st, err
	}
	host := netip.PrefixFrom(ip, 32)
	if err := m.IPCache.Iterate(func(p netip.Prefix, _ maps.IPCacheEntry) bool {
		st.ipcache = st.ipcache || p == host
		return true
	}); err != nil {
		return st, err
	}
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Dst: prefixNet(host), Table: syscall.RT_TABLE_MAIN},
		netlink.RT_FILTER_DST|netlink.RT_FILTER_TABLE)
	if err != nil {
		return st, err
	}
	st.route = len(routes) > 0
	return st, nil
}

// TestPrivilegedDatapathPodDelete: with host routing and the eBPF
// datapath on, a running pod has its programs attached (two pinned tcx
// links), its policy map pinned, its cellium_lxc and cellium_ipcache
// entries and its /32 route; deleting the pod through the API removes
// all of them, its veth (and with it the tcx attachments) too.
func TestPrivilegedDatapathPodDelete(t *testing.T) {
	e := newEnv(t, envOptions{hostRouting: true, bpf: true})
	blackhole(t, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(100 + cidrs.Load()), 0, 0}), 16))
	names := []string{"keep", "gone"}
	e.createPods(map[string]map[string]string{"keep": {"app": "keep"}, "gone": {"app": "gone"}})
	pods := e.waitRunning(names, 90*time.Second)
	ceps := e.waitCEPs(pods, 60*time.Second)
	sbs := e.sandboxes()
	id := func(n string) uint16 { return uint16(ceps[n].Status.ID) }
	ip := func(n string) netip.Addr { return netip.MustParseAddr(pods[n].Status.PodIP) }

	full := func(n string) error {
		st, err := e.datapathState(id(n), ip(n))
		if err != nil {
			return err
		}
		slices.Sort(st.linkPins)
		if want := []string{"cil_from_container", "cil_to_container"}; !slices.Equal(st.linkPins, want) ||
			!st.policyPin || !st.lxc || !st.ipcache || !st.route {
			return fmt.Errorf("pod %s (endpoint %d, %s): %+v, want links %v, policy map, lxc, ipcache and route", n, id(n), ip(n), st, want)
		}
		return nil
	}
	eventually(t, 30*time.Second, "both pods' datapath programmed", func() error {
		return errors.Join(full("keep"), full("gone"))
	})
	veth := sbs["gone"].HostInterfaces
	if len(veth) == 0 {
		t.Fatal("no host veth recorded for pod gone")
	}

	e.deletePods([]string{"gone"}, nil)
	e.waitGone([]string{"gone"}, sbs, 60*time.Second)
	eventually(t, 30*time.Second, "pod gone's datapath state removed", func() error {
		st, err := e.datapathState(id("gone"), ip("gone"))
		if err != nil {
			return err
		}
		if len(st.linkPins) > 0 || st.policyPin || st.lxc || st.ipcache || st.route {
			return fmt.Errorf("left of endpoint %d (%s): %+v", id("gone"), ip("gone"), st)
		}
		linkDir, _ := dpPaths(e, id("gone"))
		if _, err := os.Stat(linkDir); !os.IsNotExist(err) {
			return fmt.Errorf("link directory %s still exists (%v)", linkDir, err)
		}
		for _, l := range veth {
			if _, ok := linkExists(l); ok {
				return fmt.Errorf("veth %s still exists", l)
			}
		}
		return nil
	})
	// The other pod keeps everything.
	if err := full("keep"); err != nil {
		t.Error(err)
	}
}

// dpStream is a TCP stream from one pod to another's echo server: a
// message every 10ms, each echoed back within 3s or the stream fails.
type dpStream struct {
	mu     sync.Mutex
	rounds int
	err    error
	wake   chan struct{}
	stop   chan struct{}
	done   chan struct{}
}

// startStream connects from src to dst:dpPort and keeps the stream going
// until stopped.
func startStream(t *testing.T, src, dst dpPeer) *dpStream {
	t.Helper()
	var c net.Conn
	if err := src.netns.Do(func(ns.NetNS) error {
		var err error
		c, err = net.DialTimeout("tcp4", netip.AddrPortFrom(dst.ip, dpPort).String(), 3*time.Second)
		return err
	}); err != nil {
		t.Fatalf("stream %s->%s: %v", src.name, dst.name, err)
	}
	s := &dpStream{wake: make(chan struct{}), stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		defer c.Close()
		msg := make([]byte, 64)
		got := make([]byte, 64)
		tk := time.NewTicker(10 * time.Millisecond)
		defer tk.Stop()
		for i := 0; ; i++ {
			select {
			case <-s.stop:
				return
			case <-tk.C:
			}
			binary.BigEndian.PutUint64(msg, uint64(i))
			_ = c.SetDeadline(time.Now().Add(3 * time.Second))
			_, err := c.Write(msg)
			if err == nil {
				_, err = io.ReadFull(c, got)
			}
			if err == nil && string(got) != string(msg) {
				err = fmt.Errorf("round %d: echo differs", i)
			}
			s.mu.Lock()
			if err != nil {
				s.err = err
			} else {
				s.rounds++
			}
			close(s.wake)
			s.wake = make(chan struct{})
			s.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(s.Stop)
	return s
}

// Stop ends the stream (idempotent).
func (s *dpStream) Stop() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
}

// progress waits until the stream has made n more round trips, failing
// the test when it broke or stalled for 10s.
func (s *dpStream) progress(t *testing.T, n int, what string) {
	t.Helper()
	s.mu.Lock()
	target := s.rounds + n
	s.mu.Unlock()
	for {
		s.mu.Lock()
		rounds, err, wake := s.rounds, s.err, s.wake
		s.mu.Unlock()
		if err != nil {
			t.Fatalf("%s: the stream broke after %d round trips: %v", what, rounds, err)
		}
		if rounds >= target {
			return
		}
		select {
		case <-wake:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: the stream stalled at %d round trips", what, rounds)
		}
	}
}

// watchDatapath reads the peers' datapath state (datapathState) over and
// over until the returned function is called, which returns every
// reading that lacked something (a link pin, the policy map pin, the
// cellium_lxc or cellium_ipcache entry, the route).
func (e *env) watchDatapath(peers []dpPeer) func() []string {
	stop := make(chan struct{})
	done := make(chan struct{})
	var lost []string
	go func() {
		defer close(done)
		for {
			for _, p := range peers {
				st, err := e.datapathState(p.ep, p.ip)
				switch {
				case err != nil:
					lost = append(lost, fmt.Sprintf("%s %s: %v", time.Now().Format("15:04:05.000"), p.name, err))
				case len(st.linkPins) != 2 || !st.policyPin || !st.lxc || !st.ipcache || !st.route:
					lost = append(lost, fmt.Sprintf("%s %s (endpoint %d): %+v", time.Now().Format("15:04:05.000"), p.name, p.ep, st))
				}
			}
			select {
			case <-stop:
				return
			default:
			}
		}
	}()
	return func() []string {
		close(stop)
		<-done
		return lost
	}
}

// TestPrivilegedDatapathAgentRestart: a TCP stream from a to b, allowed
// by a CNP (b: ingress from app=a on TCP 8080), goes on across an agent
// restart after SIGTERM and one after SIGKILL, also while the agent is
// down; c -> b stays denied while the agent is down (the programs and
// pinned maps outlive it); after each restart the endpoints are restored
// with the same IDs and veths, not recreated, and at no moment of the
// restart do a's and b's programs, policy maps, map entries or routes go
// missing.
func TestPrivilegedDatapathAgentRestart(t *testing.T) {
	e := newEnv(t, envOptions{hostRouting: true, bpf: true})
	blackhole(t, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(100 + cidrs.Load()), 0, 0}), 16))
	names := []string{"a", "b", "c"}
	peers := e.dpPods(names)
	a, b, c := peers["a"], peers["b"], peers["c"]
	_, err := e.cilium.CiliumV2().CiliumNetworkPolicies(e.ns).Create(e.ctx, &ciliumv2.CiliumNetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "b-from-a", Namespace: e.ns},
		Spec: &api.Rule{EndpointSelector: &api.EndpointSelector{MatchLabels: map[string]string{"app": "b"}},
			Ingress: []api.IngressRule{{
				IngressCommonRule: api.IngressCommonRule{FromEndpoints: []api.EndpointSelector{{MatchLabels: map[string]string{"app": "a"}}}},
				ToPorts:           api.PortRules{{Ports: []api.PortProtocol{{Port: "8080", Protocol: api.ProtoTCP}}}},
			}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "c->b denied, a->b allowed", func() error {
		if ok, err := probe(c.netns, "tcp", b.ip, 300*time.Millisecond); err != nil || ok {
			return fmt.Errorf("c->b/tcp passes (%v)", err)
		}
		if ok, err := probe(a.netns, "tcp", b.ip, time.Second); err != nil || !ok {
			return fmt.Errorf("a->b/tcp does not pass (%v)", err)
		}
		return nil
	})
	epsBefore, err := e.endpoints()
	if err != nil {
		t.Fatal(err)
	}
	sbs := e.sandboxes()
	ifindex := func(n string) int {
		i, _ := linkExists(sbs[n].HostInterfaces[0])
		return i
	}
	ifBefore := map[string]int{}
	for _, n := range names {
		ifBefore[n] = ifindex(n)
	}

	s := startStream(t, a, b)
	s.progress(t, 20, "before any restart")
	for _, restart := range []struct {
		name string
		stop func() error
	}{{"SIGTERM", e.node.StopAgent}, {"SIGKILL", e.node.KillAgent}} {
		if err := restart.stop(); err != nil {
			t.Fatalf("%s: %v", restart.name, err)
		}
		s.progress(t, 50, restart.name+": agent down")
		if ok, err := probe(c.netns, "tcp", b.ip, time.Second); err != nil || ok {
			t.Errorf("%s: c->b/tcp passes while the agent is down (%v)", restart.name, err)
		}
		// From the stop until the endpoints are restored, the datapath
		// keeps all of a's and b's state: nothing is pruned and redone.
		watch := e.watchDatapath([]dpPeer{a, b})
		if err := e.node.StartAgent(e.ctx); err != nil {
			t.Fatalf("%s: start the agent again: %v", restart.name, err)
		}
		s.progress(t, 50, restart.name+": agent back")
		eventually(t, 30*time.Second, restart.name+": endpoints restored", func() error {
			eps, err := e.endpoints()
			if err != nil {
				return err
			}
			for _, n := range names {
				if eps[n].ID != epsBefore[n].ID {
					return fmt.Errorf("pod %s: endpoint %d, was %d", n, eps[n].ID, epsBefore[n].ID)
				}
				if eps[n].Status.State != models.EndpointStateReady {
					return fmt.Errorf("pod %s: endpoint %d not ready: %+v", n, eps[n].ID, eps[n].Status)
				}
				if got := ifindex(n); got != ifBefore[n] {
					return fmt.Errorf("pod %s: veth ifindex %d, was %d (recreated)", n, got, ifBefore[n])
				}
			}
			return nil
		})
		if lost := watch(); len(lost) > 0 {
			t.Errorf("%s: datapath state lost during the restart:\n%s", restart.name, strings.Join(lost, "\n"))
		}
		if ok, err := probe(c.netns, "tcp", b.ip, time.Second); err != nil || ok {
			t.Errorf("%s: c->b/tcp passes after the restart (%v)", restart.name, err)
		}
	}
	s.progress(t, 20, "after both restarts")
	s.Stop()
}

// broken waits until the stream fails (its next round trip gets no
// answer within 3s), failing the test when it is still going after
// timeout.
func (s *dpStream) broken(t *testing.T, timeout time.Duration, what string) {
	t.Helper()
	deadline := time.After(timeout)
	for {
		s.mu.Lock()
		rounds, err, wake := s.rounds, s.err, s.wake
		s.mu.Unlock()
		if err != nil {
			return
		}
		select {
		case <-wake:
		case <-deadline:
			t.Fatalf("%s: the stream still goes after %s (%d round trips)", what, timeout, rounds)
		}
	}
}

// TestPrivilegedDatapathPolicyUpdateStream: TCP streams a->b and c->b run
// while a CNP (b: ingress from app=a on TCP 8080) is applied: a's stream
// goes on without a single policy drop, c's stops, its packets dropped as
// "Policy denied" at b's endpoint.
func TestPrivilegedDatapathPolicyUpdateStream(t *testing.T) {
	e := newEnv(t, envOptions{hostRouting: true, bpf: true})
	blackhole(t, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(100 + cidrs.Load()), 0, 0}), 16))
	peers := e.dpPods([]string{"a", "b", "c"})
	a, b, c := peers["a"], peers["b"], peers["c"]
	drops := e.watchDrops()
	sa := startStream(t, a, b)
	sc := startStream(t, c, b)
	sa.progress(t, 20, "a->b before the policy")
	sc.progress(t, 20, "c->b before the policy")
	_, err := e.cilium.CiliumV2().CiliumNetworkPolicies(e.ns).Create(e.ctx, &ciliumv2.CiliumNetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "b-from-a", Namespace: e.ns},
		Spec: &api.Rule{EndpointSelector: &api.EndpointSelector{MatchLabels: map[string]string{"app": "b"}},
			Ingress: []api.IngressRule{{
				IngressCommonRule: api.IngressCommonRule{FromEndpoints: []api.EndpointSelector{{MatchLabels: map[string]string{"app": "a"}}}},
				ToPorts:           api.PortRules{{Ports: []api.PortProtocol{{Port: "8080", Protocol: api.ProtoTCP}}}},
			}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	applied := time.Now()
	at, ok := drops.wait(applied, 30*time.Second, policyDrop(b.ep, dropPolicy, c.ip, b.ip, "tcp"))
	if !ok {
		t.Fatal("no Policy denied drop of the c->b stream at b's endpoint within 30s")
	}
	t.Logf("c->b stream's first dropped packet %s after the policy was created", at.Sub(applied))
	sc.broken(t, 30*time.Second, "c->b after the policy")
	sa.progress(t, 100, "a->b after the policy")
	if _, dropped := drops.wait(applied, 0, func(ev models.MonitorEvent) bool {
		return ev.SrcIP == a.ip.String() || ev.DstIP == a.ip.String()
	}); dropped {
		t.Error("a packet of the allowed a->b stream was dropped")
	}
}
