package loader

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/datapath/bpf"
	"github.com/cellium/cellium/test/privileged"
)

// nodePortNS is a node namespace with two uplink-like veths, up0
// (10.79.0.1/24) and up1 (10.79.1.1/24), their peers in the same
// namespace; with defaultVia, an IPv4 default route via up0.
func nodePortNS(t *testing.T, defaultVia bool) ns.NetNS {
	t.Helper()
	node := newTestNS(t)
	err := node.Do(func(ns.NetNS) error {
		for i, name := range []string{"up0", "up1"} {
			if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}); err != nil {
				return err
			}
			l, err := netlink.LinkByName(name)
			if err != nil {
				return err
			}
			ip := net.IPv4(10, 79, byte(i), 1)
			if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: ip, Mask: net.CIDRMask(24, 32)}}); err != nil {
				return err
			}
			for _, n := range []string{name, name + "p"} {
				ln, err := netlink.LinkByName(n)
				if err == nil {
					err = netlink.LinkSetUp(ln)
				}
				if err != nil {
					return err
				}
			}
		}
		if !defaultVia {
			return nil
		}
		l, err := netlink.LinkByName("up0")
		if err != nil {
			return err
		}
		return netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: net.IPv4(10, 79, 0, 254)})
	})
	if err != nil {
		t.Fatal(err)
	}
	return node
}

func ifindexIn(t *testing.T, node ns.NetNS, name string) int {
	t.Helper()
	var idx int
	if err := node.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(name)
		if err == nil {
			idx = l.Attrs().Index
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return idx
}

// nodePortLink returns the program ID on the pinned link of device, and
// checks that it is cil_from_netdev at the tcx ingress of ifindex with
// snat as its NODEPORT_SNAT_IPV4.
func nodePortLink(t *testing.T, layout Layout, device string, ifindex int, snat netip.Addr) ebpf.ProgramID {
	t.Helper()
	id, pi := pinnedTCX(t, filepath.Join(layout.NodePortDir(), device), ifindex, ebpf.AttachTCXIngress, bpf.NodeportProgCilFromNetdev)
	// The SNAT address is one of the program's constants, in its .rodata.
	spec, err := bpf.LoadNodeport()
	if err != nil {
		t.Fatal(err)
	}
	off := spec.Variables[bpf.NodeportVarNODEPORT_SNAT_IPV4].Offset
	ids, _ := pi.MapIDs()
	found := false
	for _, id := range ids {
		m, err := ebpf.NewMapFromID(id)
		if err != nil {
			continue
		}
		mi, err := m.Info()
		if err == nil && mi.Type == ebpf.Array && mi.ValueSize >= off+4 && mi.MaxEntries == 1 && filepath.Ext(mi.Name) == ".rodata" {
			v := make([]byte, mi.ValueSize)
			if err := m.Lookup(uint32(0), &v); err == nil {
				found = true
				if got := netip.AddrFrom4([4]byte(v[off : off+4])); got != snat {
					t.Errorf("%s: NODEPORT_SNAT_IPV4 %s, want %s", device, got, snat)
				}
			}
		}
		m.Close()
	}
	if !found {
		t.Errorf("%s: no .rodata with the SNAT address", device)
	}
	pinnedTCX(t, filepath.Join(layout.NodePortEgressDir(), device), ifindex, ebpf.AttachTCXEgress, bpf.NodeportProgCilToNetdev)
	return id
}

// pinnedTCX checks that the link pinned at pin is a tcx link of type at
// on ifindex running the program called name, and returns the program's
// ID and info.
func pinnedTCX(t *testing.T, pin string, ifindex int, at ebpf.AttachType, name string) (ebpf.ProgramID, *ebpf.ProgramInfo) {
	t.Helper()
	l, err := link.LoadPinnedLink(pin, nil)
	if err != nil {
		t.Fatalf("pinned link %s: %v", pin, err)
	}
	info, err := l.Info()
	l.Close()
	if err != nil {
		t.Fatal(err)
	}
	if tcx := info.TCX(); tcx == nil || int(tcx.Ifindex) != ifindex || ebpf.AttachType(tcx.AttachType) != at {
		t.Errorf("link %s: %+v, want %s on ifindex %d", pin, info.TCX(), at, ifindex)
	}
	prog, err := ebpf.NewProgramFromID(info.Program)
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	pi, err := prog.Info()
	if err != nil {
		t.Fatal(err)
	}
	if pi.Name != name && pi.Name != name[:min(15, len(name))] {
		t.Errorf("link %s runs %q, want %s", pin, pi.Name, name)
	}
	return info.Program, pi
}

// TestPrivilegedNodePortAttach: Ensure attaches cil_from_netdev to the
// tcx ingress (and cil_to_netdev to the egress) of every device named, each with its own address as SNAT
// source, through links pinned in <root>/cellium/nodeport; a second
// Ensure loads nothing; a device left out of the list is detached and
// its pin removed; a missing device is os.ErrNotExist while the others
// stay attached; Remove detaches everything.
func TestPrivilegedNodePortAttach(t *testing.T) {
	privileged.Require(t)
	layout := Layout{Root: t.TempDir()}
	if err := layout.MountBPFFS(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(layout.Root, 0); err != nil {
			t.Errorf("unmount test bpffs: %v", err)
		}
	})
	node := nodePortNS(t, false)
	up0, up1 := ifindexIn(t, node, "up0"), ifindexIn(t, node, "up1")
	a0, a1 := netip.MustParseAddr("10.79.0.1"), netip.MustParseAddr("10.79.1.1")
	// Load balancer maps of another size than the object's
	// (--bpf-lb-map-max): the program loads against them as they are.
	np := &NodePort{Layout: layout, Netns: Netns{Path: node.Path()}, LBMapMax: 4096}
	if err := np.Ensure([]string{"up0", "up1"}); err != nil {
		t.Fatal(err)
	}
	first := nodePortLink(t, layout, "up0", up0, a0)
	nodePortLink(t, layout, "up1", up1, a1)
	if err := np.Ensure([]string{"up0", "up1"}); err != nil {
		t.Fatal(err)
	}
	if again := nodePortLink(t, layout, "up0", up0, a0); again != first {
		t.Error("a second Ensure loaded the program again")
	}
	if err := np.Ensure([]string{"up0", "nosuchdev"}); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Ensure with a missing device: %v, want os.ErrNotExist", err)
	}
	nodePortLink(t, layout, "up0", up0, a0)
	for _, dir := range []string{layout.NodePortDir(), layout.NodePortEgressDir()} {
		if _, err := os.Stat(filepath.Join(dir, "up1")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("pin of up1 left in %s after it was dropped from the list: %v", dir, err)
		}
	}
	// A restarted agent (a new NodePort) replaces the program in place.
	np2 := &NodePort{Layout: layout, Netns: Netns{Path: node.Path()}, LBMapMax: 4096}
	if err := np2.Ensure([]string{"up0"}); err != nil {
		t.Fatal(err)
	}
	if got := nodePortLink(t, layout, "up0", up0, a0); got == first {
		t.Error("a new agent's Ensure kept the old program")
	}
	if err := np2.Remove(); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{layout.NodePortDir(), layout.NodePortEgressDir()} {
		entries, _ := os.ReadDir(dir)
		if len(entries) != 0 {
			t.Errorf("pins left in %s after Remove: %v", dir, entries)
		}
	}
	for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
		var progs int
		if err := node.Do(func(ns.NetNS) error {
			res, err := link.QueryPrograms(link.QueryOptions{Target: up0, Attach: at})
			if err == nil {
				progs = len(res.Programs)
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if progs != 0 {
			t.Errorf("%d programs left on up0's %s after Remove", progs, at)
		}
	}
}

// TestPrivilegedDetectNodePortDevices: without --devices the uplinks are
// the devices of the default routes, else the device holding the node's
// address.
func TestPrivilegedDetectNodePortDevices(t *testing.T) {
	privileged.Require(t)
	withDefault := nodePortNS(t, true)
	got, err := DetectNodePortDevices(Netns{Path: withDefault.Path()}, netip.MustParseAddr("10.79.1.1"))
	if err != nil || !slices.Equal(got, []string{"up0"}) {
		t.Errorf("with a default route via up0: %v, %v; want [up0]", got, err)
	}
	without := nodePortNS(t, false)
	got, err = DetectNodePortDevices(Netns{Path: without.Path()}, netip.MustParseAddr("10.79.1.1"))
	if err != nil || !slices.Equal(got, []string{"up1"}) {
		t.Errorf("without a default route, node IP on up1: %v, %v; want [up1]", got, err)
	}
	got, err = DetectNodePortDevices(Netns{Path: without.Path()}, netip.Addr{})
	if err != nil || len(got) != 0 {
		t.Errorf("neither: %v, %v; want none", got, err)
	}
}
