package plugin

import (
	"context"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	types040 "github.com/containernetworking/cni/pkg/types/040"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"

	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/datapath/link"
)

// The tests in this file run cellium-cni through libcni on real network
// namespaces: a "node" namespace the test makes (the plugin runs in it,
// see cniEnv) and one namespace per pod. Nothing touches the host's own
// links.

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

// privilegedEnv is a cniEnv whose plugins run in a fresh node namespace.
func privilegedEnv(t *testing.T) *cniEnv {
	t.Helper()
	requirePrivileged(t)
	return newCNIEnv(t, newTestNS(t))
}

// links returns the links of a namespace.
func links(t testing.TB, n ns.NetNS) []netlink.Link {
	t.Helper()
	var out []netlink.Link
	err := n.Do(func(ns.NetNS) error {
		var err error
		for range 10 { // retry dumps interrupted by concurrent changes
			if out, err = netlink.LinkList(); err == nil {
				return nil
			}
		}
		return err
	})
	if err != nil {
		t.Fatalf("list links in %s: %v", n.Path(), err)
	}
	return out
}

func linkNames(t testing.TB, n ns.NetNS) []string {
	t.Helper()
	var names []string
	for _, l := range links(t, n) {
		names = append(names, l.Attrs().Name)
	}
	slices.Sort(names)
	return names
}

// endpointLinks returns the names of the lxc*/tmp* links of the node.
func endpointLinks(t testing.TB, node ns.NetNS) []string {
	t.Helper()
	var names []string
	for _, name := range linkNames(t, node) {
		if strings.HasPrefix(name, link.HostIfPrefix) || strings.HasPrefix(name, "tmp") {
			names = append(names, name)
		}
	}
	return names
}

// assertNothingLeft fails t if the node has an endpoint link, a pod
// namespace that still exists has any link but lo, or the agent holds an
// address or an endpoint.
func (e *cniEnv) assertNothingLeft(t testing.TB, pods ...ns.NetNS) {
	t.Helper()
	if left := endpointLinks(t, e.node); len(left) > 0 {
		t.Errorf("links left in the node namespace: %v", left)
	}
	for _, p := range pods {
		if _, err := os.Stat(p.Path()); err != nil {
			continue
		}
		if names := linkNames(t, p); !slices.Equal(names, []string{"lo"}) {
			t.Errorf("pod namespace %s holds %v, want only lo", p.Path(), names)
		}
	}
	e.agent.assertEmpty(t)
}

// TestPrivilegedAddCheckDel runs ADD, CHECK and DEL (twice) in every CNI
// version and checks the result's shape against the links, the addresses
// and the endpoint the agent was given.
func TestPrivilegedAddCheckDel(t *testing.T) {
	requirePrivileged(t)
	for _, v := range SupportedVersions().SupportedVersions() {
		t.Run(v, func(t *testing.T) {
			e := privilegedEnv(t)
			pod := newTestNS(t)
			wantMTU := fakeMTU
			var extra map[string]any
			if v == "1.0.0" {
				// The netconf's MTU wins over the agent's.
				wantMTU = 1400
				extra = map[string]any{"mtu": 1400}
			}
			list := e.conflist(v, extra)
			cid := "ctr-" + strings.ReplaceAll(v, ".", "")
			rt := podRuntime(cid, pod.Path(), "web")

			e.agent.callLog()
			res, err := e.add(list, rt)
			if err != nil {
				t.Fatalf("ADD: %v", err)
			}
			// Two round trips: the MTU comes with the address.
			wantCalls := []string{"POST /v1/ipam?container-id=" + cid + "&owner=test%2Fweb", "PUT /v1/endpoint"}
			if calls := e.agent.callLog(); !slices.Equal(calls, wantCalls) {
				t.Errorf("ADD called the agent with %q, want %q", calls, wantCalls)
			}
			if res.Version() != v {
				t.Fatalf("result version %s, want %s", res.Version(), v)
			}
			// The result in the requested version, read through the
			// current version for the common checks.
			cur, err := types100.NewResultFromResult(res)
			if err != nil {
				t.Fatal(err)
			}
			hostName := link.HostInterfaceName(cid, "eth0")
			if len(cur.Interfaces) != 2 || cur.Interfaces[0].Name != hostName || cur.Interfaces[0].Sandbox != "" ||
				cur.Interfaces[1].Name != "eth0" || cur.Interfaces[1].Sandbox != pod.Path() {
				t.Fatalf("interfaces %v", cur.Interfaces)
			}
			if len(cur.IPs) != 1 || cur.IPs[0].Interface == nil || *cur.IPs[0].Interface != 1 ||
				cur.IPs[0].Gateway.String() != fakeGateway {
				t.Fatalf("ips %v", cur.IPs)
			}
			podIP := cur.IPs[0].Address
			if ones, bits := podIP.Mask.Size(); ones != 32 || bits != 32 || !strings.HasPrefix(podIP.IP.String(), "10.210.") {
				t.Fatalf("pod address %s, want a /32 from the agent", &podIP)
			}
			if len(cur.Routes) != 2 || cur.Routes[0].Dst.String() != fakeGateway+"/32" || cur.Routes[0].GW != nil ||
				cur.Routes[1].Dst.String() != "0.0.0.0/0" || cur.Routes[1].GW.String() != fakeGateway {
				t.Fatalf("routes %v", cur.Routes)
			}
			switch r := res.(type) {
			case *types040.Result:
				if r.IPs[0].Version != "4" {
					t.Errorf("0.x address version %q", r.IPs[0].Version)
				}
			case *types100.Result:
				if v == "1.1.0" {
					if r.Interfaces[1].Mtu != wantMTU || r.Routes[0].Scope == nil || *r.Routes[0].Scope != int(netlink.SCOPE_LINK) {
						t.Errorf("1.1.0 result lacks mtu or scope: %v %v", r.Interfaces[1], r.Routes[0])
					}
				} else if r.Interfaces[1].Mtu != 0 || r.Routes[0].Scope != nil {
					t.Errorf("1.0.0 result has 1.1.0 fields: %v %v", r.Interfaces[1], r.Routes[0])
				}
			default:
				t.Fatalf("result type %T", res)
			}

			// The result matches the links.
			hostLink := findLink(t, e.node, hostName)
			podLink := findLink(t, pod, "eth0")
			if hostLink.Attrs().HardwareAddr.String() != cur.Interfaces[0].Mac ||
				podLink.Attrs().HardwareAddr.String() != cur.Interfaces[1].Mac {
				t.Errorf("MACs: host %s pod %s, result %s %s", hostLink.Attrs().HardwareAddr, podLink.Attrs().HardwareAddr,
					cur.Interfaces[0].Mac, cur.Interfaces[1].Mac)
			}
			if hostLink.Attrs().MTU != wantMTU || podLink.Attrs().MTU != wantMTU {
				t.Errorf("MTU: host %d pod %d, want %d", hostLink.Attrs().MTU, podLink.Attrs().MTU, wantMTU)
			}

			// The agent got the endpoint as made.
			ep := e.agent.endpoint(cid)
			if ep == nil {
				t.Fatal("the agent has no endpoint")
			}
			want := models.EndpointChangeRequest{
				ContainerID: cid, ContainerInterfaceName: "eth0",
				K8sNamespace: "test", K8sPodName: "web", K8sUID: "uid-web",
				InterfaceName: hostName, InterfaceIndex: hostLink.Attrs().Index,
				MAC: cur.Interfaces[1].Mac, HostMAC: cur.Interfaces[0].Mac,
				NetnsPath: pod.Path(), SyncBuildEndpoint: true,
			}
			want.Addressing.IPV4 = podIP.IP.String()
			if *ep.Spec != want {
				t.Errorf("endpoint request\n got %+v\nwant %+v", *ep.Spec, want)
			}
			ips, _ := e.agent.state()
			if ips[podIP.IP.String()] != "test/web" {
				t.Errorf("agent IPs %v, want %s owned by test/web", ips, podIP.IP)
			}

			if v != "0.3.1" { // CHECK exists from 0.4.0 on
				if err := e.check(list, rt); err != nil {
					t.Fatalf("CHECK: %v", err)
				}
			}

			for i := range 2 {
				if err := e.del(list, rt); err != nil {
					t.Fatalf("DEL #%d: %v", i+1, err)
				}
			}
			e.assertNothingLeft(t, pod)
		})
	}
}

// TestPrivilegedAddOlderAgent: an agent whose POST /v1/ipam reply has no
// mtu still gets its MTU applied, from GET /v1/config.
func TestPrivilegedAddOlderAgent(t *testing.T) {
	e := privilegedEnv(t)
	e.agent.set(func(a *fakeAgent) { a.noIPAMMTU = true; a.mtu = 1380 })
	pod := newTestNS(t)
	list := e.conflist("1.1.0", nil)
	rt := podRuntime("ctr-old-agent", pod.Path(), "web")
	e.agent.callLog()
	if _, err := e.add(list, rt); err != nil {
		t.Fatalf("ADD: %v", err)
	}
	if calls := e.agent.callLog(); len(calls) != 3 || calls[1] != "GET /v1/config" {
		t.Errorf("ADD called the agent with %q, want POST ipam, GET config, PUT endpoint", calls)
	}
	if mtu := findLink(t, pod, "eth0").Attrs().MTU; mtu != 1380 {
		t.Errorf("pod MTU %d, want the agent's 1380", mtu)
	}
	if err := e.del(list, rt); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	e.assertNothingLeft(t, pod)
}

func findLink(t testing.TB, n ns.NetNS, name string) netlink.Link {
	t.Helper()
	for _, l := range links(t, n) {
		if l.Attrs().Name == name {
			return l
		}
	}
	t.Fatalf("no link %s in %s", name, n.Path())
	return nil
}

// TestPrivilegedAgentDown: with no agent, ADD fails with "try again later"
// and leaves nothing; DEL removes the interface it can and also asks to be
// retried, so that the agent releases the address later.
func TestPrivilegedAgentDown(t *testing.T) {
	e := privilegedEnv(t)
	pod := newTestNS(t)
	e.socket = "/run/cellium-test-no-agent/agent.sock"
	list := e.conflist("1.1.0", nil)
	rt := podRuntime("ctr-down", pod.Path(), "down")

	_, err := e.add(list, rt)
	wantCode(t, err, types.ErrTryAgainLater)
	e.assertNothingLeft(t, pod)

	wantCode(t, e.del(list, rt), types.ErrTryAgainLater)
	e.assertNothingLeft(t, pod)
}

// TestPrivilegedAgentDownDuringDel: the agent is gone between ADD and DEL.
// DEL removes the veth at once and fails with "try again later"; once the
// agent is back, the repeated DEL deletes the endpoint and its address.
func TestPrivilegedAgentDownDuringDel(t *testing.T) {
	e := privilegedEnv(t)
	pod := newTestNS(t)
	list := e.conflist("1.1.0", nil)
	rt := podRuntime("ctr-del-down", pod.Path(), "deldown")
	if _, err := e.add(list, rt); err != nil {
		t.Fatal(err)
	}

	up := e.socket
	e.socket = "/run/cellium-test-no-agent/agent.sock"
	down := e.conflist("1.1.0", nil)
	wantCode(t, e.del(down, rt), types.ErrTryAgainLater)
	if left := endpointLinks(t, e.node); len(left) > 0 {
		t.Fatalf("DEL without agent left %v", left)
	}
	if _, eps := e.agent.state(); len(eps) != 1 {
		t.Fatalf("agent endpoints %v", eps)
	}

	e.socket = up
	list = e.conflist("1.1.0", nil)
	if err := e.del(list, rt); err != nil {
		t.Fatalf("DEL with the agent back: %v", err)
	}
	e.assertNothingLeft(t, pod)
}

// TestPrivilegedEndpointCreateFails: when the agent refuses the endpoint,
// ADD rolls back: no veth, the address released, no endpoint.
func TestPrivilegedEndpointCreateFails(t *testing.T) {
	requirePrivileged(t)
	for _, tc := range []struct {
		name   string
		status int // 0: the agent drops the connection
		code   uint
		inMsg  string
	}{
		{"refused", 500, types.ErrInternal, "regeneration failed: injected"},
		{"conflict", 409, types.ErrInternal, "regeneration failed: injected"},
		{"not ready", 503, types.ErrTryAgainLater, "regeneration failed: injected"},
		{"connection dropped", 0, types.ErrTryAgainLater, "PUT /v1/endpoint"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := privilegedEnv(t)
			pod := newTestNS(t)
			list := e.conflist("1.1.0", nil)
			rt := podRuntime("ctr-fail", pod.Path(), "fail")
			e.agent.set(func(a *fakeAgent) {
				a.putFailure = models.Error{Code: tc.status, Message: "regeneration failed: injected"}
				a.putDrop = tc.status == 0
			})
			_, err := e.add(list, rt)
			wantCode(t, err, tc.code)
			if !strings.Contains(err.Error(), tc.inMsg) {
				t.Errorf("error %q lacks %q", err, tc.inMsg)
			}
			calls := e.agent.callLog()
			// The rollback is one call: the endpoint if it has this ADD's
			// address, and that address.
			for _, want := range []string{"POST /v1/ipam", "PUT /v1/endpoint", "DELETE /v1/endpoint"} {
				if !slices.ContainsFunc(calls, func(c string) bool { return strings.HasPrefix(c, want) }) {
					t.Errorf("calls %v lack %s", calls, want)
				}
			}
			e.assertNothingLeft(t, pod)

			// The runtime's DEL after the failed ADD is fine.
			if err := e.del(list, rt); err != nil {
				t.Fatalf("DEL after failed ADD: %v", err)
			}
			e.assertNothingLeft(t, pod)
		})
	}
}

// TestPrivilegedSameContainerTwoNetns: ADD of a container ID that already
// has a working attachment (pod namespace A), again into A or into another
// namespace B, must fail and leave A alone: its veth, its address and its endpoint
// survive, and B keeps nothing (no link, no address). Before, the
// leftover sweep deleted A's host veth (same interface name) or the
// rollback deleted A's endpoint by container ID and freed A's address
// (another interface name).
func TestPrivilegedSameContainerTwoNetns(t *testing.T) {
	e := privilegedEnv(t)
	podA, podB := newTestNS(t), newTestNS(t)
	list := e.conflist("1.1.0", nil)
	rtA := podRuntime("ctr-dup", podA.Path(), "dup")
	if _, err := e.add(list, rtA); err != nil {
		t.Fatalf("ADD into A: %v", err)
	}
	ipsA, _ := e.agent.state()
	epA := e.agent.endpoint("ctr-dup")
	hostA := endpointLinks(t, e.node)
	if epA == nil || len(ipsA) != 1 || len(hostA) != 1 {
		t.Fatalf("after ADD into A: endpoint %v, IPs %v, host links %v", epA, ipsA, hostA)
	}

	for _, tc := range []struct {
		name   string
		netns  string
		ifName string
	}{
		{"A again", podA.Path(), "eth0"}, // refused before anything changes
		{"B eth0", podB.Path(), "eth0"},
		{"B eth1", podB.Path(), "eth1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rt := podRuntime("ctr-dup", tc.netns, "dup")
			rt.IfName = tc.ifName
			if _, err := e.add(list, rt); err == nil {
				t.Fatalf("second ADD of the container succeeded")
			}
			if err := e.check(list, rtA); err != nil {
				t.Errorf("A's attachment is damaged: %v", err)
			}
			ips, eps := e.agent.state()
			if fmt.Sprint(ips) != fmt.Sprint(ipsA) {
				t.Errorf("agent IPs %v, want A's only %v (B's address must be released, A's kept)", ips, ipsA)
			}
			if ep := e.agent.endpoint("ctr-dup"); len(eps) != 1 || ep == nil || ep.ID != epA.ID || ep.Spec.NetnsPath != podA.Path() {
				t.Errorf("endpoints %v: A's endpoint %d replaced or gone: %+v", eps, epA.ID, ep)
			}
			if left := endpointLinks(t, e.node); !slices.Equal(left, hostA) {
				t.Errorf("node links %v, want A's %v", left, hostA)
			}
			if names := linkNames(t, podB); !slices.Equal(names, []string{"lo"}) {
				t.Errorf("B holds %v, want only lo", names)
			}
		})
	}

	if err := e.del(list, rtA); err != nil {
		t.Fatalf("DEL of A: %v", err)
	}
	e.assertNothingLeft(t, podA, podB)
}

// TestPrivilegedBadNetns: a missing namespace and the node's own
// namespace are refused with ErrInvalidNetNS before the agent is asked;
// an existing eth0 in the pod is refused with ErrCodeInterfaceExists and
// left alone.
func TestPrivilegedBadNetns(t *testing.T) {
	e := privilegedEnv(t)
	list := e.conflist("1.1.0", nil)

	gone := newTestNS(t)
	removeTestNS(t, gone)
	_, err := e.add(list, podRuntime("ctr-gone", gone.Path(), "gone"))
	wantCode(t, err, types.ErrInvalidNetNS)

	_, err = e.add(list, podRuntime("ctr-node", e.node.Path(), "node"))
	wantCode(t, err, types.ErrInvalidNetNS)
	if calls := e.agent.callLog(); len(calls) != 0 {
		t.Errorf("the agent was called: %v", calls)
	}

	pod := newTestNS(t)
	if err := pod.Do(func(ns.NetNS) error {
		attrs := netlink.NewLinkAttrs()
		attrs.Name = "eth0"
		return netlink.LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: "other0"})
	}); err != nil {
		t.Fatal(err)
	}
	_, err = e.add(list, podRuntime("ctr-exists", pod.Path(), "exists"))
	wantCode(t, err, ErrCodeInterfaceExists)
	if names := linkNames(t, pod); !slices.Equal(names, []string{"eth0", "lo", "other0"}) {
		t.Errorf("pod links %v, want eth0, lo, other0 untouched", names)
	}
	e.assertNothingLeft(t)
}

// TestPrivilegedDelMissingNetns: DEL after the pod's namespace is gone
// succeeds and cleans up the agent's side.
func TestPrivilegedDelMissingNetns(t *testing.T) {
	e := privilegedEnv(t)
	pod := newTestNS(t)
	list := e.conflist("1.1.0", nil)
	rt := podRuntime("ctr-nons", pod.Path(), "nons")
	if _, err := e.add(list, rt); err != nil {
		t.Fatal(err)
	}
	removeTestNS(t, pod)
	if err := e.del(list, rt); err != nil {
		t.Fatalf("DEL with the netns gone: %v", err)
	}
	rt.NetNS = ""
	if err := e.del(list, rt); err != nil {
		t.Fatalf("DEL without CNI_NETNS: %v", err)
	}
	e.assertNothingLeft(t)
}

// TestPrivilegedCheckFindsProblems: CHECK reports a missing route, an
// endpoint the agent forgot and an agent that is down, each with its code.
func TestPrivilegedCheckFindsProblems(t *testing.T) {
	e := privilegedEnv(t)
	pod := newTestNS(t)
	list := e.conflist("1.1.0", nil)
	rt := podRuntime("ctr-check", pod.Path(), "check")
	if _, err := e.add(list, rt); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.del(list, rt) })
	if err := e.check(list, rt); err != nil {
		t.Fatalf("CHECK right after ADD: %v", err)
	}

	// The pod loses its default route.
	if err := pod.Do(func(ns.NetNS) error {
		_, dst, _ := net.ParseCIDR("0.0.0.0/0")
		routes, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Dst: dst}, netlink.RT_FILTER_DST)
		if err != nil || len(routes) == 0 {
			return fmt.Errorf("find default route: %v (%d routes)", err, len(routes))
		}
		return netlink.RouteDel(&routes[0])
	}); err != nil {
		t.Fatal(err)
	}
	err := e.check(list, rt)
	wantCode(t, err, ErrCodeEndpointMismatch)
	if !strings.Contains(err.Error(), "0.0.0.0/0") {
		t.Errorf("CHECK error %q does not name the route", err)
	}

	// The agent is down.
	up := e.socket
	e.socket = "/run/cellium-test-no-agent/agent.sock"
	wantCode(t, e.check(e.conflist("1.1.0", nil), rt), types.ErrTryAgainLater)
	e.socket = up
	list = e.conflist("1.1.0", nil)

	// The agent forgot the endpoint.
	e.agent.set(func(a *fakeAgent) { delete(a.endpoints, "ctr-check") })
	wantCode(t, e.check(list, rt), ErrCodeEndpointNotFound)
}

// TestPrivilegedConcurrentAdds: 50 ADDs at once through libcni all succeed
// with distinct addresses and interfaces; 50 DELs at once leave nothing.
func TestPrivilegedConcurrentAdds(t *testing.T) {
	const pods = 50
	e := privilegedEnv(t)
	list := e.conflist("1.1.0", nil)
	podNS := make([]ns.NetNS, pods)
	rts := make([]*podRT, pods)
	for i := range pods {
		podNS[i] = newTestNS(t)
		rts[i] = &podRT{rt: podRuntime(fmt.Sprintf("ctr-%02d", i), podNS[i].Path(), fmt.Sprintf("pod-%02d", i))}
	}
	t.Cleanup(func() {
		for _, r := range rts {
			_ = e.del(list, r.rt)
		}
	})

	start := time.Now()
	parallel(t, pods, func(i int) error {
		res, err := e.add(list, rts[i].rt)
		if err != nil {
			return err
		}
		cur, err := types100.NewResultFromResult(res)
		if err != nil {
			return err
		}
		rts[i].ip = cur.IPs[0].Address.IP.String()
		return nil
	})
	t.Logf("%d concurrent ADDs through libcni: %v", pods, time.Since(start).Round(time.Millisecond))
	ips := map[string]bool{}
	for _, r := range rts {
		ips[r.ip] = true
	}
	if len(ips) != pods {
		t.Fatalf("%d distinct addresses for %d pods", len(ips), pods)
	}
	if got := endpointLinks(t, e.node); len(got) != pods {
		t.Fatalf("%d host links for %d pods", len(got), pods)
	}
	agentIPs, eps := e.agent.state()
	if len(agentIPs) != pods || len(eps) != pods {
		t.Fatalf("agent holds %d addresses and %d endpoints for %d pods", len(agentIPs), len(eps), pods)
	}
	start = time.Now()
	parallel(t, pods, func(i int) error { return e.del(list, rts[i].rt) })
	t.Logf("%d concurrent DELs through libcni: %v", pods, time.Since(start).Round(time.Millisecond))
	e.assertNothingLeft(t, podNS...)
}

type podRT struct {
	rt *libcni.RuntimeConf
	ip string
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

// TestPrivilegedGC: GC removes an orphan veth the agent never heard of and
// a stale endpoint, and keeps the valid attachments, the agent's own
// endpoint with its veth, and a foreign lxc link.
func TestPrivilegedGC(t *testing.T) {
	e := privilegedEnv(t)
	ctx := context.Background()
	list := e.conflist("1.1.0", nil)
	host := link.Host{NetnsPath: e.node.Path()}

	// Two live pods through the plugin.
	var live []*podRT
	for i := range 2 {
		pod := newTestNS(t)
		r := &podRT{rt: podRuntime(fmt.Sprintf("live-%d", i), pod.Path(), fmt.Sprintf("live-%d", i))}
		if _, err := e.add(list, r.rt); err != nil {
			t.Fatal(err)
		}
		live = append(live, r)
	}
	// An orphan: a cellium veth whose attachment the runtime no longer
	// has and the agent never knew (a plugin killed mid-ADD).
	orphanPod := newTestNS(t)
	if _, err := host.SetupEndpoint(ctx, link.Spec{ContainerID: "orphan", NetnsPath: orphanPod.Path(),
		IPv4: net.IPv4(10, 99, 0, 2), Gateway: net.IPv4(10, 99, 0, 1)}); err != nil {
		t.Fatal(err)
	}
	// The agent's own endpoint, with a veth but no pod.
	healthNS := newTestNS(t)
	if _, err := host.SetupEndpoint(ctx, link.Spec{ContainerID: "cellium-health", NetnsPath: healthNS.Path(),
		IPv4: net.IPv4(10, 99, 0, 3), Gateway: net.IPv4(10, 99, 0, 1)}); err != nil {
		t.Fatal(err)
	}
	e.agent.addEndpoint(models.Endpoint{Spec: &models.EndpointChangeRequest{ContainerID: "cellium-health", ContainerInterfaceName: "eth0"}})
	// A stale endpoint of a CNI attachment the runtime forgot.
	e.agent.addEndpoint(models.Endpoint{Spec: &models.EndpointChangeRequest{
		ContainerID: "stale", ContainerInterfaceName: "eth0", K8sNamespace: "test", K8sPodName: "stale"}})
	// A foreign link with the lxc prefix.
	if err := e.node.Do(func(ns.NetNS) error {
		attrs := netlink.NewLinkAttrs()
		attrs.Name = "lxcforeign"
		return netlink.LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: "foreignpeer"})
	}); err != nil {
		t.Fatal(err)
	}

	valid := []types.GCAttachment{{ContainerID: "live-0", IfName: "eth0"}, {ContainerID: "live-1", IfName: "eth0"}}

	// Without the agent GC does nothing.
	up := e.socket
	e.socket = "/run/cellium-test-no-agent/agent.sock"
	wantCode(t, e.gc(e.conflist("1.1.0", nil), valid), types.ErrTryAgainLater)
	if got := len(endpointLinks(t, e.node)); got != 5 {
		t.Fatalf("GC without agent changed links: %v", endpointLinks(t, e.node))
	}
	e.socket = up
	list = e.conflist("1.1.0", nil)

	if err := e.gc(list, valid); err != nil {
		t.Fatalf("GC: %v", err)
	}
	want := []string{
		link.HostInterfaceName("cellium-health", "eth0"),
		link.HostInterfaceName("live-0", "eth0"),
		link.HostInterfaceName("live-1", "eth0"),
		"lxcforeign",
	}
	slices.Sort(want)
	if got := endpointLinks(t, e.node); !slices.Equal(got, want) {
		t.Fatalf("links after GC %v, want %v", got, want)
	}
	if _, eps := e.agent.state(); !slices.Equal(eps, []string{"cellium-health", "live-0", "live-1"}) {
		t.Fatalf("agent endpoints after GC %v", eps)
	}
	for _, r := range live {
		if err := e.check(list, r.rt); err != nil {
			t.Errorf("CHECK of a valid attachment after GC: %v", err)
		}
		if err := e.del(list, r.rt); err != nil {
			t.Fatal(err)
		}
	}
}

// BenchmarkPrivilegedAddDel measures one ADD and one DEL through libcni,
// one pod at a time, against the fake agent.
func BenchmarkPrivilegedAddDel(b *testing.B) {
	requirePrivileged(b)
	e := newCNIEnv(b, newTestNS(b))
	list := e.conflist("1.1.0", map[string]any{"enable-debug": false})
	pod := newTestNS(b)
	rt := podRuntime("bench", pod.Path(), "bench")
	var add, del time.Duration
	for b.Loop() {
		start := time.Now()
		if _, err := e.add(list, rt); err != nil {
			b.Fatal(err)
		}
		add += time.Since(start)
		start = time.Now()
		if err := e.del(list, rt); err != nil {
			b.Fatal(err)
		}
		del += time.Since(start)
	}
	b.ReportMetric(float64(add.Microseconds())/float64(b.N)/1000, "ms/add")
	b.ReportMetric(float64(del.Microseconds())/float64(b.N)/1000, "ms/del")
}
