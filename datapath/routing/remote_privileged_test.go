package routing

import (
	"errors"
	"net"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/statedb"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/nftables"
	"github.com/vishvananda/netlink"

	"github.com/cellium/cellium/statedb/nodes"
	"github.com/cellium/cellium/statedb/reconciler"
	"github.com/cellium/cellium/statedb/routes"
	"github.com/cellium/cellium/test/privileged"
)

// The remote-routing tests' node: uplink eth0 10.216.0.1/24 (MTU 1500, a
// veth to a namespace of the test), no default route: the uplink is found
// by the node's InternalIP. Other nodes are rows of the nodes table.
var (
	remoteNodeIP = netip.MustParseAddr("10.216.0.1")
	remoteRouter = netip.MustParseAddr("10.216.1.1")
)

func newUplinkNode(t *testing.T) (ns.NetNS, *netlink.Handle) {
	t.Helper()
	node := newTestNS(t)
	peer := newTestNS(t)
	nh := nodeHandle(t, node)
	if err := nh.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0", MTU: 1500}, PeerName: "up-peer",
		PeerNamespace: netlink.NsFd(int(peer.Fd()))}); err != nil {
		t.Fatal(err)
	}
	l, err := nh.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	if err := nh.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: remoteNodeIP.AsSlice(), Mask: net.CIDRMask(24, 32)}}); err != nil {
		t.Fatal(err)
	}
	if err := nh.LinkSetUp(l); err != nil {
		t.Fatal(err)
	}
	return node, nh
}

func (h *harness) setUplinkLocalNode() {
	wtxn := h.db.WriteTxn(h.local)
	_, _, _ = h.local.Insert(wtxn, &nodes.LocalNode{Name: "test-node", InternalIP: remoteNodeIP, RouterIP: remoteRouter,
		PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.216.1.0/24")}})
	wtxn.Commit()
}

func (h *harness) upsertNode(name, ip, cidr string) {
	wtxn := h.db.WriteTxn(h.nodes)
	_, _, _ = h.nodes.Insert(wtxn, &nodes.Node{Name: name, Source: nodes.SourceCustomResource,
		Addresses: []nodes.Address{{Type: nodes.AddressInternalIP, IP: netip.MustParseAddr(ip)}},
		PodCIDRs:  []netip.Prefix{netip.MustParsePrefix(cidr)}})
	wtxn.Commit()
}

func (h *harness) deleteNode(name string) {
	wtxn := h.db.WriteTxn(h.nodes)
	_, _, _ = h.nodes.Delete(wtxn, &nodes.Node{Name: name})
	wtxn.Commit()
}

// remoteRoutes returns the agent's routes to 10.216.x.0/24 other than the
// node's own, as "PREFIX dev DEV" or "PREFIX via GW".
func remoteRoutes(nh *netlink.Handle) ([]string, error) {
	rs, err := nodeRoutes(nh)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, r := range rs {
		if int(r.Protocol) != routes.Protocol || r.Dst == nil {
			continue
		}
		if ones, _ := r.Dst.Mask.Size(); ones == 32 {
			continue
		}
		if r.Gw != nil {
			out = append(out, r.Dst.String()+" via "+r.Gw.String())
			continue
		}
		l, err := nh.LinkByIndex(r.LinkIndex)
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			continue // its device is being deleted
		}
		if err != nil {
			return nil, err
		}
		out = append(out, r.Dst.String()+" dev "+l.Attrs().Name)
	}
	slices.Sort(out)
	return out, nil
}

func devicesDone(txn statedb.ReadTxn, tb Tables, n int) bool {
	c := 0
	for d := range tb.Devices.All(txn) {
		if d.Status.Kind != reconciler.StatusDone {
			return false
		}
		c++
	}
	return c == n
}

// TestPrivilegedTunnelRouting: in tunnel mode the reconcilers make
// cilium_vxlan (external, UDP 8472, MTU = the uplink's 1500 - 50, ARP off,
// labelled as the agent's) and route every other node's pod CIDR into it;
// the routes follow the nodes table's rows; masquerading skips the other
// nodes' pod CIDRs and addresses; a harness without remote routing prunes
// the device and the routes.
func TestPrivilegedTunnelRouting(t *testing.T) {
	privileged.Require(t)
	node, nh := newUplinkNode(t)
	h := startHarnessRemote(t, node, time.Hour, true, &RemoteConfig{
		Remote: routes.Remote{Mode: routes.RoutingModeTunnel, TunnelPort: 8472}, Netns: Netns{Path: node.Path()},
	})
	h.setUplinkLocalNode()
	h.upsertNode("test-node", remoteNodeIP.String(), "10.216.1.0/24") // its own row: skipped
	h.upsertNode("n2", "10.216.0.2", "10.216.2.0/24")
	h.upsertNode("n3", "10.99.0.3", "10.216.3.0/24") // another subnet: tunnels do not care
	h.endpointsRestored()
	h.waitTables("devices reconciled", func(txn statedb.ReadTxn) bool { return devicesDone(txn, h.tables, 2) })

	l, err := nh.LinkByName(routes.TunnelDevice)
	if err != nil {
		t.Fatalf("%s: %v", routes.TunnelDevice, err)
	}
	vx, ok := l.(*netlink.Vxlan)
	if !ok {
		t.Fatalf("%s is a %s, want vxlan", routes.TunnelDevice, l.Type())
	}
	if !vx.FlowBased || vx.Port != 8472 || vx.Attrs().MTU != 1450 || vx.Attrs().RawFlags&syscall.IFF_NOARP == 0 ||
		vx.Attrs().Alias != deviceAlias || vx.Attrs().Flags&net.FlagUp == 0 {
		t.Errorf("%s: external=%v port=%d mtu=%d noarp=%v alias=%q up=%v; want external, 8472, 1450, noarp, %q, up",
			routes.TunnelDevice, vx.FlowBased, vx.Port, vx.Attrs().MTU, vx.Attrs().RawFlags&syscall.IFF_NOARP != 0,
			vx.Attrs().Alias, vx.Attrs().Flags&net.FlagUp != 0, deviceAlias)
	}
	want := []string{"10.216.2.0/24 dev cilium_vxlan", "10.216.3.0/24 dev cilium_vxlan"}
	waitKernel(t, "routes to both remote pod CIDRs", func() (bool, error) {
		got, err := remoteRoutes(nh)
		return slices.Equal(got, want), err
	})

	// Masquerade: the node's own pod CIDR is masqueraded except to the
	// other nodes' pod CIDRs and addresses, whose exceptions come first.
	waitKernel(t, "masquerade exceptions", func() (bool, error) {
		var tags []string
		err := MasqueradeOps{Netns: h.nodeNetns}.conn(func(c *nftables.Conn) error {
			rs, err := rules(c)
			for _, r := range rs {
				tags = append(tags, string(r.UserData))
			}
			return err
		})
		if err != nil || len(tags) != 5 {
			return false, err
		}
		if tags[4] != masqTag+"10.216.1.0/24" {
			return false, nil
		}
		slices.Sort(tags[:4])
		return slices.Equal(tags[:4], []string{exceptTag + "10.216.0.2/32", exceptTag + "10.216.2.0/24",
			exceptTag + "10.216.3.0/24", exceptTag + "10.99.0.3/32"}), nil
	})

	// A node goes: its route goes.
	h.deleteNode("n3")
	waitKernel(t, "the route of the deleted node removed", func() (bool, error) {
		got, err := remoteRoutes(nh)
		return slices.Equal(got, want[:1]), err
	})

	// An agent without remote routing prunes the device and the routes.
	h.stop()
	h2 := startHarness(t, node, 100*time.Millisecond)
	h2.setUplinkLocalNode()
	h2.endpointsRestored()
	waitKernel(t, "cilium_vxlan and the remote routes pruned", func() (bool, error) {
		got, err := remoteRoutes(nh)
		if err != nil || len(got) != 0 {
			return false, err
		}
		_, err = nh.LinkByName(routes.TunnelDevice)
		var nf netlink.LinkNotFoundError
		return errors.As(err, &nf), nil
	})
}

// TestPrivilegedNativeRouting: native mode with auto-direct-node-routes
// routes another node's pod CIDR via its InternalIP when that node is on
// the uplink's subnet, and not otherwise; no tunnel device is made.
func TestPrivilegedNativeRouting(t *testing.T) {
	privileged.Require(t)
	node, nh := newUplinkNode(t)
	h := startHarnessRemote(t, node, time.Hour, false, &RemoteConfig{
		Remote: routes.Remote{Mode: routes.RoutingModeNative, AutoDirectNodeRoutes: true}, Netns: Netns{Path: node.Path()},
	})
	h.setUplinkLocalNode()
	h.upsertNode("n2", "10.216.0.2", "10.216.2.0/24")
	h.upsertNode("n3", "10.99.0.3", "10.216.3.0/24") // not on eth0's subnet
	h.endpointsRestored()
	h.waitTables("devices reconciled", func(txn statedb.ReadTxn) bool { return devicesDone(txn, h.tables, 1) })
	waitKernel(t, "the direct route to n2's pod CIDR", func() (bool, error) {
		got, err := remoteRoutes(nh)
		return slices.Equal(got, []string{"10.216.2.0/24 via 10.216.0.2"}), err
	})
	if _, err := nh.LinkByName(routes.TunnelDevice); err == nil {
		t.Errorf("%s exists in native mode", routes.TunnelDevice)
	}
	h.deleteNode("n2")
	waitKernel(t, "the direct route removed with its node", func() (bool, error) {
		got, err := remoteRoutes(nh)
		return len(got) == 0, err
	})
}

// TestPrivilegedDetectUplink: the uplink is the device --devices names,
// else the one holding the node IP, else the default route's; none is
// ErrNoUplink with what to do.
func TestPrivilegedDetectUplink(t *testing.T) {
	privileged.Require(t)
	node, nh := newUplinkNode(t) // eth0 10.216.0.1/24, MTU 1500
	peer := newTestNS(t)
	if err := nh.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "up2", MTU: 9000}, PeerName: "up2-peer",
		PeerNamespace: netlink.NsFd(int(peer.Fd()))}); err != nil {
		t.Fatal(err)
	}
	l, err := nh.LinkByName("up2")
	if err != nil {
		t.Fatal(err)
	}
	if err := nh.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(10, 217, 0, 1), Mask: net.CIDRMask(24, 32)}}); err != nil {
		t.Fatal(err)
	}
	if err := nh.LinkSetUp(l); err != nil {
		t.Fatal(err)
	}
	if err := nh.RouteAdd(&netlink.Route{Gw: net.IPv4(10, 217, 0, 2), LinkIndex: l.Attrs().Index}); err != nil {
		t.Fatal(err)
	}
	n := Netns{Path: node.Path()}
	for _, c := range []struct {
		devices []string
		nodeIP  netip.Addr
		want    string
		mtu     int
	}{
		{nil, remoteNodeIP, "eth0", 1500},
		{nil, netip.Addr{}, "up2", 9000},
		{nil, netip.MustParseAddr("10.1.2.3"), "up2", 9000},
		{[]string{"up2"}, remoteNodeIP, "up2", 9000},
	} {
		up, err := DetectUplink(n, c.devices, c.nodeIP)
		if err != nil || up.Name != c.want || up.MTU != c.mtu {
			t.Errorf("devices %v node IP %v: %+v, %v; want %s MTU %d", c.devices, c.nodeIP, up, err, c.want, c.mtu)
		}
	}
	if up, _ := DetectUplink(n, nil, remoteNodeIP); !up.SameSubnet(netip.MustParseAddr("10.216.0.9")) || up.SameSubnet(netip.MustParseAddr("10.217.0.9")) {
		t.Errorf("subnets of eth0: %v", up.Subnets)
	}
	if _, err := DetectUplink(n, []string{"nope"}, remoteNodeIP); !errors.Is(err, ErrNoUplink) {
		t.Errorf("--devices=nope: %v, want ErrNoUplink", err)
	}
	empty := newTestNS(t)
	if _, err := DetectUplink(Netns{Path: empty.Path()}, nil, remoteNodeIP); !errors.Is(err, ErrNoUplink) || !strings.Contains(err.Error(), "--devices") {
		t.Errorf("no uplink: %v, want ErrNoUplink naming --devices", err)
	}
}
