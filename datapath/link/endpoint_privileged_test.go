package link

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/cellium/cellium/test/privileged"
)

// Every address below lives only inside network namespaces the tests make:
// a "node" namespace plays the host (forwarding on, the router IP on a
// dummy device like cilium_host) and each pod gets its own namespace. The
// real host's links and routes are never touched.
var testGateway = net.IPv4(10, 200, 0, 1).To4()

// podIP is the address of the i-th test pod, 10.200.x.y with y in 10..209.
func podIP(i int) net.IP {
	return net.IPv4(10, 200, byte(i/200), byte(10+i%200)).To4()
}

func podSpec(i int, netnsPath string) Spec {
	return Spec{
		ContainerID: fmt.Sprintf("container-%03d", i),
		NetnsPath:   netnsPath,
		MTU:         1450,
		RouteMTU:    1400,
		IPv4:        podIP(i),
		Gateway:     testGateway,
	}
}

// newTestNS makes a network namespace that is removed when tb ends.
func newTestNS(tb testing.TB) ns.NetNS {
	tb.Helper()
	n, err := testutils.NewNS()
	if err != nil {
		tb.Fatalf("create netns: %v", err)
	}
	tb.Cleanup(func() { removeTestNS(tb, n) })
	return n
}

func removeTestNS(tb testing.TB, n ns.NetNS) {
	_ = n.Close()
	if _, err := os.Stat(n.Path()); err != nil {
		return // already removed by the test
	}
	if err := testutils.UnmountNS(n); err != nil {
		tb.Errorf("remove netns %s: %v", n.Path(), err)
	}
}

// testHandle is a netlink handle in n, closed when tb ends.
func testHandle(tb testing.TB, n ns.NetNS) *netlink.Handle {
	tb.Helper()
	h, err := newHandle(n)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(h.Close)
	return h
}

type testNode struct {
	ns   ns.NetNS
	nl   *netlink.Handle
	host Host
}

// newTestNode makes a namespace that acts as the node: IPv4 forwarding on
// and the router IP on cellium_host, one end of a veth pair as Cilium's
// cilium_host/cilium_net (the test kernel has no dummy driver).
func newTestNode(tb testing.TB) *testNode {
	tb.Helper()
	n := newTestNS(tb)
	nh := testHandle(tb, n)
	if err := writeSysctls(n, sysctl{path: "net/ipv4/ip_forward", value: "1"}); err != nil {
		tb.Fatal(err)
	}
	attrs := netlink.NewLinkAttrs()
	attrs.Name = "cellium_host"
	router := &netlink.Veth{LinkAttrs: attrs, PeerName: "cellium_net", PeerTxQLen: -1}
	if err := nh.LinkAdd(router); err != nil {
		tb.Fatalf("add router device: %v", err)
	}
	gw := hostNet(testGateway)
	if err := nh.AddrAdd(router, &netlink.Addr{IPNet: &gw}); err != nil {
		tb.Fatalf("add router IP: %v", err)
	}
	for _, name := range []string{"cellium_host", "cellium_net"} {
		l, err := nh.LinkByName(name)
		if err == nil {
			err = nh.LinkSetUp(l)
		}
		if err != nil {
			tb.Fatal(err)
		}
	}
	return &testNode{ns: n, nl: nh, host: Host{NetnsPath: n.Path()}}
}

// addBridge adds a bridge, a link kind that is not an endpoint veth.
func addBridge(tb testing.TB, nh *netlink.Handle, name, alias string) {
	tb.Helper()
	attrs := netlink.NewLinkAttrs()
	attrs.Name = name
	br := &netlink.Bridge{LinkAttrs: attrs}
	if err := nh.LinkAdd(br); err != nil {
		tb.Fatalf("add bridge %s: %v", name, err)
	}
	if alias != "" {
		if err := nh.LinkSetAlias(br, alias); err != nil {
			tb.Fatal(err)
		}
	}
}

// setupPod runs SetupEndpoint and removes the endpoint when tb ends.
func (node *testNode) setupPod(tb testing.TB, spec Spec) Result {
	tb.Helper()
	res, err := node.host.SetupEndpoint(context.Background(), spec)
	if err != nil {
		tb.Fatalf("SetupEndpoint: %v", err)
	}
	tb.Cleanup(func() {
		if err := node.host.RemoveEndpoint(context.Background(), res.HostIfName, res.NetnsPath); err != nil {
			tb.Errorf("RemoveEndpoint: %v", err)
		}
	})
	return res
}

// linkNames lists the names of the links in a namespace.
func linkNames(tb testing.TB, nh *netlink.Handle) []string {
	tb.Helper()
	links, err := retryDump(nh.LinkList)
	if err != nil {
		tb.Fatal(err)
	}
	var names []string
	for _, l := range links {
		names = append(names, l.Attrs().Name)
	}
	slices.Sort(names)
	return names
}

// assertNoEndpointLinks fails tb if the node holds any lxc* or tmp* link
// or the pod any link but lo.
func assertNoEndpointLinks(tb testing.TB, node *testNode, podNL *netlink.Handle) {
	tb.Helper()
	for _, name := range linkNames(tb, node.nl) {
		if strings.HasPrefix(name, HostIfPrefix) || strings.HasPrefix(name, tmpPeerPrefix) {
			tb.Errorf("link %s left in the node namespace", name)
		}
	}
	if podNL != nil {
		if names := linkNames(tb, podNL); !slices.Equal(names, []string{"lo"}) {
			tb.Errorf("pod namespace holds links %v, want only lo", names)
		}
	}
}

func TestPrivilegedSetupEndpointTraffic(t *testing.T) {
	requirePrivileged(t)
	ctx := context.Background()
	node := newTestNode(t)
	podA, podB := newTestNS(t), newTestNS(t)
	specA, specB := podSpec(0, podA.Path()), podSpec(1, podB.Path())
	resA := node.setupPod(t, specA)
	resB := node.setupPod(t, specB)

	t.Run("result", func(t *testing.T) {
		want := Result{
			HostIfName: HostInterfaceName(specA.ContainerID, "eth0"),
			PodIfName:  "eth0",
			NetnsPath:  podA.Path(),
			MTU:        1450,
			IPv4:       hostNet(specA.IPv4),
			Gateway:    testGateway,
			Routes: []Route{
				{Dst: hostNet(testGateway)},
				{Dst: net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}, Via: testGateway, MTU: 1400},
			},
		}
		got := resA
		got.HostIfIndex, got.HostMAC, got.PodIfIndex, got.PodMAC = 0, nil, 0, nil
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("Result =\n%+v\nwant\n%+v", got, want)
		}
		if resA.HostIfIndex == 0 || resA.PodIfIndex == 0 || len(resA.HostMAC) != 6 || len(resA.PodMAC) != 6 {
			t.Errorf("Result lacks indexes or MACs: %+v", resA)
		}
		if resA.HostIfName == resB.HostIfName {
			t.Errorf("both pods got host link %s", resA.HostIfName)
		}
	})

	t.Run("kernel state", func(t *testing.T) {
		podNL := testHandle(t, podA)
		hostLink, err := node.nl.LinkByName(resA.HostIfName)
		if err != nil {
			t.Fatal(err)
		}
		podLink, err := podNL.LinkByName("eth0")
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range []netlink.Link{hostLink, podLink} {
			a := l.Attrs()
			if l.Type() != "veth" || a.MTU != 1450 || a.Flags&net.FlagUp == 0 || a.TxQLen != txQueueLen {
				t.Errorf("link %s: type %s MTU %d flags %v txqlen %d; want veth, 1450, up, %d",
					a.Name, l.Type(), a.MTU, a.Flags, a.TxQLen, txQueueLen)
			}
		}
		if hostLink.Attrs().Index != resA.HostIfIndex || hostLink.Attrs().HardwareAddr.String() != resA.HostMAC.String() {
			t.Errorf("host link index/MAC %d %s, Result says %d %s", hostLink.Attrs().Index, hostLink.Attrs().HardwareAddr, resA.HostIfIndex, resA.HostMAC)
		}
		if podLink.Attrs().Index != resA.PodIfIndex || podLink.Attrs().HardwareAddr.String() != resA.PodMAC.String() {
			t.Errorf("pod link index/MAC %d %s, Result says %d %s", podLink.Attrs().Index, podLink.Attrs().HardwareAddr, resA.PodIfIndex, resA.PodMAC)
		}
		if hostLink.Attrs().ParentIndex != podLink.Attrs().Index {
			t.Errorf("host link's peer is ifindex %d, pod link is %d", hostLink.Attrs().ParentIndex, podLink.Attrs().Index)
		}

		addrs, err := podNL.AddrList(podLink, netlink.FAMILY_V4)
		if err != nil {
			t.Fatal(err)
		}
		if len(addrs) != 1 || addrs[0].IPNet.String() != "10.200.0.10/32" {
			t.Errorf("pod addresses %v, want only 10.200.0.10/32", addrs)
		}
		routes, err := podNL.RouteList(podLink, netlink.FAMILY_V4)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, r := range routes {
			got = append(got, fmt.Sprintf("%s gw=%v scope=%s mtu=%d", r.Dst, r.Gw, r.Scope, r.MTU))
		}
		want := []string{
			"0.0.0.0/0 gw=10.200.0.1 scope=universe mtu=1400",
			"10.200.0.1/32 gw=<nil> scope=link mtu=0",
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("pod routes\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}

		sysctls := []struct {
			n     ns.NetNS
			path  string
			value string
		}{
			{node.ns, rpFilter(resA.HostIfName), "0"},
			{node.ns, disableIPv6(resA.HostIfName), "1"},
			{podA, disableIPv6("eth0"), "1"},
		}
		for _, s := range sysctls {
			if v, err := readSysctl(s.n, s.path); err != nil || v != s.value {
				t.Errorf("sysctl %s = %q (%v), want %q", s.path, v, err, s.value)
			}
		}
	})

	t.Run("check and list", func(t *testing.T) {
		for _, s := range []Spec{specA, specB} {
			if err := node.host.CheckEndpoint(ctx, s); err != nil {
				t.Error(err)
			}
		}
		links, err := node.host.ListHostInterfaces()
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, l := range links {
			got = append(got, fmt.Sprintf("%s %s %s/%s up=%v mtu=%d", l.Name, l.Kind, l.ContainerID, l.IfName, l.Up, l.MTU))
		}
		want := []string{
			fmt.Sprintf("%s veth container-000/eth0 up=true mtu=1450", resA.HostIfName),
			fmt.Sprintf("%s veth container-001/eth0 up=true mtu=1450", resB.HostIfName),
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("ListHostInterfaces:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	})

	// The node routes to each pod through its host link.
	for _, r := range []struct {
		res Result
		ip  net.IP
	}{{resA, specA.IPv4}, {resB, specB.IPv4}} {
		if err := node.host.EnsurePodRoute(ctx, r.res.HostIfName, r.ip); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := node.host.DeletePodRoute(ctx, r.res.HostIfName, r.ip); err != nil {
				t.Error(err)
			}
		})
	}

	t.Run("ping", func(t *testing.T) {
		ttl, err := ping(podA, specB.IPv4)
		if err != nil {
			t.Fatalf("ping %s from pod A: %v", specB.IPv4, err)
		}
		// Pod B answers with TTL 64; one routed hop (the node) leaves 63.
		if ttl != 63 {
			t.Errorf("echo reply TTL %d, want 63 (one hop through the node)", ttl)
		}
		if _, err := ping(podB, specA.IPv4); err != nil {
			t.Fatalf("ping %s from pod B: %v", specA.IPv4, err)
		}
		if _, err := ping(podA, testGateway); err != nil {
			t.Fatalf("ping the router IP from pod A: %v", err)
		}
	})

	t.Run("tcp", func(t *testing.T) {
		peer, err := tcpEcho(podB, specB.IPv4, podA, []byte("hello from pod A"))
		if err != nil {
			t.Fatal(err)
		}
		if !peer.Equal(specA.IPv4) {
			t.Errorf("server saw the connection come from %s, want pod A's %s", peer, specA.IPv4)
		}
	})
}

// ping is privileged.PingTTL for a net.IP.
func ping(from ns.NetNS, dst net.IP) (ttl int, err error) {
	return privileged.PingTTL(from, netip.AddrFrom4([4]byte(dst.To4())))
}

// tcpEcho is privileged.TCPEcho for net.IPs.
func tcpEcho(server ns.NetNS, serverIP net.IP, client ns.NetNS, msg []byte) (net.IP, error) {
	peer, err := privileged.TCPEcho(server, netip.AddrFrom4([4]byte(serverIP.To4())), client, msg)
	if err != nil {
		return nil, err
	}
	return net.IP(peer.AsSlice()), nil
}

var errInjected = errors.New("injected failure")

func TestPrivilegedSetupRollback(t *testing.T) {
	requirePrivileged(t)
	ctx := context.Background()
	node := newTestNode(t)
	pod := newTestNS(t)
	podNL := testHandle(t, pod)
	spec := podSpec(0, pod.Path())

	for _, step := range setupSteps {
		t.Run("fail at "+step, func(t *testing.T) {
			h := node.host
			h.fail = func(s string) error {
				if s == step {
					return errInjected
				}
				return nil
			}
			_, err := h.SetupEndpoint(ctx, spec)
			if !errors.Is(err, errInjected) {
				t.Fatalf("SetupEndpoint = %v, want the injected failure", err)
			}
			assertNoEndpointLinks(t, node, podNL)
		})
	}

	t.Run("host link vanishes midway", func(t *testing.T) {
		h := node.host
		h.fail = func(s string) error {
			if s == stepLabelPod {
				// Someone else deletes the pair after it was made.
				return deleteLink(node.nl, HostInterfaceName(spec.ContainerID, "eth0"))
			}
			return nil
		}
		if _, err := h.SetupEndpoint(ctx, spec); err == nil {
			t.Fatal("SetupEndpoint succeeded without its links")
		}
		assertNoEndpointLinks(t, node, podNL)
	})

	t.Run("unreachable route next hop", func(t *testing.T) {
		bad := spec
		// 192.0.2.1 (TEST-NET-1) is on no link of the pod: the kernel
		// refuses the route, after the pair was made and configured.
		bad.Routes = []Route{{Dst: net.IPNet{IP: net.IPv4(10, 0, 0, 0).To4(), Mask: net.CIDRMask(8, 32)}, Via: net.IPv4(192, 0, 2, 1)}}
		_, err := node.host.SetupEndpoint(ctx, bad)
		if err == nil || !strings.Contains(err.Error(), stepPodRoutes) {
			t.Fatalf("SetupEndpoint = %v, want a failure adding pod routes", err)
		}
		assertNoEndpointLinks(t, node, podNL)
	})

	t.Run("missing netns", func(t *testing.T) {
		bad := spec
		bad.NetnsPath = filepath.Join(t.TempDir(), "no-such-netns")
		if _, err := node.host.SetupEndpoint(ctx, bad); !errors.Is(err, ErrNetnsNotFound) {
			t.Fatalf("SetupEndpoint = %v, want ErrNetnsNotFound", err)
		}
		assertNoEndpointLinks(t, node, podNL)
	})

	t.Run("netns path is a plain file", func(t *testing.T) {
		bad := spec
		bad.NetnsPath = filepath.Join(t.TempDir(), "file")
		if err := os.WriteFile(bad.NetnsPath, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := node.host.SetupEndpoint(ctx, bad); !errors.Is(err, ErrNetnsNotFound) {
			t.Fatalf("SetupEndpoint = %v, want ErrNetnsNotFound", err)
		}
		assertNoEndpointLinks(t, node, podNL)
	})

	t.Run("pod netns is the node's", func(t *testing.T) {
		bad := spec
		bad.NetnsPath = node.ns.Path()
		bad.IfName = "cellium_host" // would be deleted as a leftover
		if _, err := node.host.SetupEndpoint(ctx, bad); !errors.Is(err, ErrInvalidSpec) {
			t.Fatalf("SetupEndpoint = %v, want ErrInvalidSpec", err)
		}
		if err := node.host.CheckEndpoint(ctx, bad); !errors.Is(err, ErrInvalidSpec) {
			t.Fatalf("CheckEndpoint = %v, want ErrInvalidSpec", err)
		}
		if err := node.host.RemoveEndpoint(ctx, "lxcnosuchlink", bad.NetnsPath); !errors.Is(err, ErrInvalidSpec) {
			t.Fatalf("RemoveEndpoint = %v, want ErrInvalidSpec", err)
		}
		if l, err := linkByName(node.nl, "cellium_host"); l == nil || err != nil {
			t.Fatalf("the node's cellium_host is gone: %v", err)
		}
		assertNoEndpointLinks(t, node, podNL)
	})

	t.Run("cancelled context", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := node.host.SetupEndpoint(cctx, spec); !errors.Is(err, context.Canceled) {
			t.Fatalf("SetupEndpoint = %v, want context.Canceled", err)
		}
		assertNoEndpointLinks(t, node, podNL)
	})

	t.Run("name taken by a non-veth", func(t *testing.T) {
		name := HostInterfaceName(spec.ContainerID, "eth0")
		addBridge(t, node.nl, name, "")
		t.Cleanup(func() { _ = deleteLink(node.nl, name) })
		if _, err := node.host.SetupEndpoint(ctx, spec); !errors.Is(err, ErrHostLinkInUse) {
			t.Fatalf("SetupEndpoint = %v, want ErrHostLinkInUse", err)
		}
		if l, err := linkByName(node.nl, name); err != nil || l == nil || l.Type() != "bridge" {
			t.Fatalf("the bridge was not left alone: %v %v", l, err)
		}
		if err := node.host.RemoveEndpoint(ctx, name, ""); !errors.Is(err, ErrHostLinkInUse) {
			t.Fatalf("RemoveEndpoint of a bridge = %v, want ErrHostLinkInUse", err)
		}
		if err := deleteLink(node.nl, name); err != nil {
			t.Fatal(err)
		}
		assertNoEndpointLinks(t, node, podNL)
	})

	t.Run("name taken by another container", func(t *testing.T) {
		other := newTestNS(t)
		first := podSpec(1, other.Path())
		first.HostIfName = HostInterfaceName(spec.ContainerID, "eth0")
		node.setupPod(t, first)
		if _, err := node.host.SetupEndpoint(ctx, spec); !errors.Is(err, ErrHostLinkInUse) {
			t.Fatalf("SetupEndpoint = %v, want ErrHostLinkInUse", err)
		}
		if err := node.host.CheckEndpoint(ctx, first); err != nil {
			t.Errorf("the other container's endpoint was damaged: %v", err)
		}
		if names := linkNames(t, podNL); !slices.Equal(names, []string{"lo"}) {
			t.Errorf("pod namespace holds links %v, want only lo", names)
		}
	})
}

func TestPrivilegedSetupEndpointIdempotent(t *testing.T) {
	requirePrivileged(t)
	ctx := context.Background()
	node := newTestNode(t)
	pod := newTestNS(t)
	spec := podSpec(0, pod.Path())
	first := node.setupPod(t, spec)
	second := node.setupPod(t, spec) // a CNI ADD retry
	if first.HostIfName != second.HostIfName {
		t.Errorf("retry gave host link %s, first attempt %s", second.HostIfName, first.HostIfName)
	}
	if err := node.host.CheckEndpoint(ctx, spec); err != nil {
		t.Error(err)
	}
	links, err := node.host.ListHostInterfaces()
	if err != nil {
		t.Fatal(err)
	}
	if len(links) != 1 || links[0].Index != second.HostIfIndex {
		t.Errorf("after a retry the node has %+v, want only the second link (ifindex %d)", links, second.HostIfIndex)
	}
	if names := linkNames(t, testHandle(t, pod)); !slices.Equal(names, []string{"eth0", "lo"}) {
		t.Errorf("pod links %v, want eth0 and lo", names)
	}
}

// TestPrivilegedSetupLeavesLiveAttachmentOfOtherNetns: a second ADD of the
// same container ID into another network namespace finds the host link
// name taken by the first attachment, whose peer lives in the first pod's
// namespace. It must refuse and leave that attachment working; before, the
// leftover sweep deleted it.
func TestPrivilegedSetupLeavesLiveAttachmentOfOtherNetns(t *testing.T) {
	requirePrivileged(t)
	ctx := context.Background()
	node := newTestNode(t)
	podA, podB := newTestNS(t), newTestNS(t)
	specA := podSpec(0, podA.Path())
	first := node.setupPod(t, specA)

	specB := podSpec(0, podB.Path()) // same container ID and interface name
	specB.IPv4 = podIP(1)
	if _, err := node.host.SetupEndpoint(ctx, specB); !errors.Is(err, ErrHostLinkInUse) ||
		!strings.Contains(err.Error(), "another network namespace") {
		t.Fatalf("SetupEndpoint into another netns = %v, want ErrHostLinkInUse naming the other namespace", err)
	}
	if err := node.host.CheckEndpoint(ctx, specA); err != nil {
		t.Errorf("first attachment damaged: %v", err)
	}
	links, err := node.host.ListHostInterfaces()
	if err != nil {
		t.Fatal(err)
	}
	if len(links) != 1 || links[0].Index != first.HostIfIndex {
		t.Errorf("node links %+v, want only the first attachment's (ifindex %d)", links, first.HostIfIndex)
	}
	if names := linkNames(t, testHandle(t, podB)); !slices.Equal(names, []string{"lo"}) {
		t.Errorf("second pod holds links %v, want only lo", names)
	}
}

func TestPrivilegedCheckEndpoint(t *testing.T) {
	requirePrivileged(t)
	ctx := context.Background()
	node := newTestNode(t)
	pod := newTestNS(t)
	podNL := testHandle(t, pod)
	spec := podSpec(0, pod.Path())
	spec.MAC = net.HardwareAddr{0x02, 0xce, 0x11, 0x00, 0x00, 0x01}
	res := node.setupPod(t, spec)
	if res.PodMAC.String() != spec.MAC.String() {
		t.Errorf("pod MAC %s, want %s", res.PodMAC, spec.MAC)
	}
	if err := node.host.CheckEndpoint(ctx, spec); err != nil {
		t.Fatalf("CheckEndpoint right after setup: %v", err)
	}

	// Remove the default route: CheckEndpoint names it.
	podLink, err := podNL.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	def := netlinkRoute(podLink.Attrs().Index, res.Routes[1])
	if err := podNL.RouteDel(def); err != nil {
		t.Fatal(err)
	}
	err = node.host.CheckEndpoint(ctx, spec)
	if !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "pod route 0.0.0.0/0 via 10.200.0.1 mtu 1400 dev eth0 missing") {
		t.Fatalf("CheckEndpoint = %v, want the missing default route", err)
	}

	// More damage: every problem is reported.
	if err := node.nl.LinkSetDown(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Index: res.HostIfIndex}}); err != nil {
		t.Fatal(err)
	}
	addr := hostNet(spec.IPv4)
	if err := podNL.AddrDel(podLink, &netlink.Addr{IPNet: &addr}); err != nil {
		t.Fatal(err)
	}
	if err := node.nl.LinkSetAlias(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Index: res.HostIfIndex}}, hostAlias("someone-else", "eth0")); err != nil {
		t.Fatal(err)
	}
	wrongMTU := spec
	wrongMTU.MTU = 1500
	wrongMTU.RouteMTU = 0
	err = node.host.CheckEndpoint(ctx, wrongMTU)
	for _, want := range []string{
		"host link " + res.HostIfName + " is down",
		"host link " + res.HostIfName + " has MTU 1450, want 1500",
		"pod link eth0 has MTU 1450, want 1500",
		"pod link eth0 lacks address 10.200.0.10/32",
		"pod route 0.0.0.0/0 via 10.200.0.1 dev eth0 missing",
		"host link " + res.HostIfName + " belongs to container someone-else interface eth0",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("CheckEndpoint = %v; want it to say %q", err, want)
		}
	}

	// With the endpoint gone both links are reported missing.
	if err := node.host.RemoveEndpoint(ctx, res.HostIfName, pod.Path()); err != nil {
		t.Fatal(err)
	}
	err = node.host.CheckEndpoint(ctx, spec)
	if !errors.Is(err, ErrLinkNotFound) || !strings.Contains(err.Error(), "host link "+res.HostIfName) || !strings.Contains(err.Error(), "pod link eth0") {
		t.Fatalf("CheckEndpoint after removal = %v, want both links missing", err)
	}

	missing := spec
	missing.NetnsPath = filepath.Join(t.TempDir(), "gone")
	if err := node.host.CheckEndpoint(ctx, missing); !errors.Is(err, ErrNetnsNotFound) {
		t.Fatalf("CheckEndpoint with a missing netns = %v, want ErrNetnsNotFound", err)
	}
}

func TestPrivilegedRemoveEndpoint(t *testing.T) {
	requirePrivileged(t)
	ctx := context.Background()
	node := newTestNode(t)
	pod := newTestNS(t)
	podNL := testHandle(t, pod)
	res := node.setupPod(t, podSpec(0, pod.Path()))

	for i := range 3 {
		if err := node.host.RemoveEndpoint(ctx, res.HostIfName, pod.Path()); err != nil {
			t.Fatalf("RemoveEndpoint call %d: %v", i+1, err)
		}
		assertNoEndpointLinks(t, node, podNL)
	}
	if err := node.host.RemoveEndpoint(ctx, res.HostIfName, filepath.Join(t.TempDir(), "gone")); err != nil {
		t.Errorf("RemoveEndpoint with a missing netns: %v", err)
	}
	if err := node.host.RemoveEndpoint(ctx, "bad/name", ""); !errors.Is(err, ErrInvalidSpec) {
		t.Errorf("RemoveEndpoint with a bad name = %v, want ErrInvalidSpec", err)
	}

	t.Run("pod namespace already deleted", func(t *testing.T) {
		gone := newTestNS(t)
		res := node.setupPod(t, podSpec(1, gone.Path()))
		removeTestNS(t, gone)
		if err := node.host.RemoveEndpoint(ctx, res.HostIfName, gone.Path()); err != nil {
			t.Fatalf("RemoveEndpoint: %v", err)
		}
		assertNoEndpointLinks(t, node, nil)
	})

	t.Run("leftover in the pod", func(t *testing.T) {
		// A link SetupEndpoint labelled for this host link is removed even
		// when the host side is already gone.
		addBridge(t, podNL, "eth0", podAlias(res.HostIfName))
		if err := node.host.RemoveEndpoint(ctx, res.HostIfName, pod.Path()); err != nil {
			t.Fatal(err)
		}
		assertNoEndpointLinks(t, node, podNL)
	})
}

func TestPrivilegedPodRoute(t *testing.T) {
	requirePrivileged(t)
	ctx := context.Background()
	node := newTestNode(t)
	pod := newTestNS(t)
	spec := podSpec(0, pod.Path())
	res := node.setupPod(t, spec)

	routesTo := func() []string {
		t.Helper()
		dst := hostNet(spec.IPv4)
		rs, err := node.nl.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Dst: &dst, Table: syscall.RT_TABLE_MAIN},
			netlink.RT_FILTER_DST|netlink.RT_FILTER_TABLE)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, r := range rs {
			out = append(out, fmt.Sprintf("%s dev %d scope %s", r.Dst, r.LinkIndex, r.Scope))
		}
		return out
	}
	want := []string{fmt.Sprintf("10.200.0.10/32 dev %d scope link", res.HostIfIndex)}
	for range 2 {
		if err := node.host.EnsurePodRoute(ctx, res.HostIfName, spec.IPv4); err != nil {
			t.Fatal(err)
		}
		if got := routesTo(); !slices.Equal(got, want) {
			t.Fatalf("routes to the pod %v, want %v", got, want)
		}
	}
	for range 2 {
		if err := node.host.DeletePodRoute(ctx, res.HostIfName, spec.IPv4); err != nil {
			t.Fatal(err)
		}
		if got := routesTo(); len(got) != 0 {
			t.Fatalf("routes to the pod after delete: %v", got)
		}
	}
	if err := node.host.EnsurePodRoute(ctx, "lxcnosuchlink", spec.IPv4); !errors.Is(err, ErrLinkNotFound) {
		t.Errorf("EnsurePodRoute on a missing link = %v, want ErrLinkNotFound", err)
	}
	if err := node.host.DeletePodRoute(ctx, "lxcnosuchlink", spec.IPv4); err != nil {
		t.Errorf("DeletePodRoute on a missing link = %v, want nil", err)
	}
	if err := node.host.EnsurePodRoute(ctx, res.HostIfName, nil); !errors.Is(err, ErrInvalidSpec) {
		t.Errorf("EnsurePodRoute without an address = %v, want ErrInvalidSpec", err)
	}
}

func TestPrivilegedConcurrentSetup(t *testing.T) {
	requirePrivileged(t)
	const pods = 50
	ctx := context.Background()
	node := newTestNode(t)
	specs := make([]Spec, pods)
	podNS := make([]ns.NetNS, pods)
	for i := range specs {
		podNS[i] = newTestNS(t)
		specs[i] = podSpec(i, podNS[i].Path())
	}
	t.Cleanup(func() {
		// Remove whatever is left if the test failed halfway.
		for _, s := range specs {
			_ = node.host.RemoveEndpoint(ctx, HostInterfaceName(s.ContainerID, "eth0"), s.NetnsPath)
		}
	})

	results := make([]Result, pods)
	parallel(t, pods, func(i int) error {
		var err error
		results[i], err = node.host.SetupEndpoint(ctx, specs[i])
		return err
	})
	names := map[string]bool{}
	for _, r := range results {
		names[r.HostIfName] = true
	}
	if len(names) != pods {
		t.Fatalf("%d distinct host links for %d pods", len(names), pods)
	}
	links, err := node.host.ListHostInterfaces()
	if err != nil {
		t.Fatal(err)
	}
	if len(links) != pods {
		t.Fatalf("ListHostInterfaces found %d links, want %d", len(links), pods)
	}
	for _, l := range links {
		if !names[l.Name] || !strings.HasPrefix(l.ContainerID, "container-") {
			t.Errorf("unexpected host link %+v", l)
		}
	}
	parallel(t, pods, func(i int) error { return node.host.CheckEndpoint(ctx, specs[i]) })

	// First and last pod talk through the node.
	first, last := 0, pods-1
	for _, i := range []int{first, last} {
		if err := node.host.EnsurePodRoute(ctx, results[i].HostIfName, specs[i].IPv4); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ping(podNS[first], specs[last].IPv4); err != nil {
		t.Fatalf("ping from pod %d to pod %d: %v", first, last, err)
	}

	parallel(t, pods, func(i int) error {
		return node.host.RemoveEndpoint(ctx, results[i].HostIfName, specs[i].NetnsPath)
	})
	assertNoEndpointLinks(t, node, nil)
}

// parallel runs f(0..n-1) concurrently and fails t for each error.
func parallel(t *testing.T, n int, f func(i int) error) {
	t.Helper()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { errs[i] = f(i) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("#%d: %v", i, err)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
}

func BenchmarkPrivilegedSetupRemove(b *testing.B) {
	requirePrivileged(b)
	ctx := context.Background()
	node := newTestNode(b)
	pod := newTestNS(b)
	spec := podSpec(0, pod.Path())
	for b.Loop() {
		res, err := node.host.SetupEndpoint(ctx, spec)
		if err != nil {
			b.Fatal(err)
		}
		if err := node.host.RemoveEndpoint(ctx, res.HostIfName, res.NetnsPath); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPrivilegedSetupRemoveParallel runs setup+remove cycles from
// GOMAXPROCS goroutines, each with its own pod, into one node.
func BenchmarkPrivilegedSetupRemoveParallel(b *testing.B) {
	requirePrivileged(b)
	ctx := context.Background()
	node := newTestNode(b)
	workers := runtime.GOMAXPROCS(0)
	specs := make(chan Spec, workers)
	for i := range workers {
		specs <- podSpec(i, newTestNS(b).Path())
	}
	b.RunParallel(func(pb *testing.PB) {
		spec := <-specs
		for pb.Next() {
			res, err := node.host.SetupEndpoint(ctx, spec)
			if err == nil {
				err = node.host.RemoveEndpoint(ctx, res.HostIfName, res.NetnsPath)
			}
			if err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// TestPrivilegedPeerNeverInHostNetns: the pod's end of the pair is made in
// the pod's namespace: the node namespace never sees a link other than
// the host end (no temporary peer created there and moved away).
func TestPrivilegedPeerNeverInHostNetns(t *testing.T) {
	requirePrivileged(t)
	node := newTestNode(t)
	pod := newTestNS(t)
	nodeNS, err := netns.GetFromPath(node.ns.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer nodeNS.Close()
	updates := make(chan netlink.LinkUpdate, 64)
	done := make(chan struct{})
	defer close(done)
	if err := netlink.LinkSubscribeWithOptions(updates, done, netlink.LinkSubscribeOptions{
		Namespace: &nodeNS, ErrorCallback: func(err error) {
			select {
			case <-done: // the subscription's socket is closing
			default:
				t.Errorf("link subscription: %v", err)
			}
		},
	}); err != nil {
		t.Fatal(err)
	}

	// Links that were there before (their state changes may still be
	// reported) are not the question.
	before := linkNames(t, node.nl)
	res := node.setupPod(t, podSpec(0, pod.Path()))

	// A marker link made after SetupEndpoint returned: once its event
	// arrives, every event of SetupEndpoint has been seen.
	attrs := netlink.NewLinkAttrs()
	attrs.Name = "mrkpeer0"
	marker := &netlink.Veth{LinkAttrs: attrs, PeerName: "mrkpeer1", PeerTxQLen: -1}
	if err := node.nl.LinkAdd(marker); err != nil {
		t.Fatalf("add marker link: %v", err)
	}
	defer func() { _ = deleteLink(node.nl, "mrkpeer0") }()
	seen := map[string]bool{}
	timeout := time.After(30 * time.Second)
	for !seen["mrkpeer0"] {
		select {
		case u := <-updates:
			name := u.Attrs().Name
			seen[name] = true
			if name == res.HostIfName || strings.HasPrefix(name, "mrkpeer") || slices.Contains(before, name) {
				continue
			}
			t.Errorf("node namespace saw link %s (type %d, MAC %s) while setting up the pod; pod MAC is %s",
				name, u.Header.Type, u.Attrs().HardwareAddr, res.PodMAC)
		case <-timeout:
			t.Fatal("no event for the marker link")
		}
	}
	if !seen[res.HostIfName] {
		t.Errorf("no event for the host link %s", res.HostIfName)
	}
}
