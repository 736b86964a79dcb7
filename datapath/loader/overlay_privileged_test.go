package loader

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/datapath/bpf"
	"github.com/cellium/cellium/test/privileged"
)

// TestPrivilegedOverlayAttach: Ensure attaches cil_from_overlay (tcx
// ingress) and cil_to_overlay (tcx egress) to the tunnel device through
// links pinned in <root>/cellium/overlay; a second Ensure changes
// nothing; a re-created device gets the programs again; Remove detaches
// them and removes the pins; a missing device is os.ErrNotExist.
func TestPrivilegedOverlayAttach(t *testing.T) {
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
	node := newTestNS(t)
	o := &Overlay{Layout: layout, Netns: Netns{Path: node.Path()}}
	if err := o.Ensure("cilium_vxlan"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Ensure without the device: %v, want os.ErrNotExist", err)
	}
	mk := func() int {
		t.Helper()
		var idx int
		err := node.Do(func(ns.NetNS) error {
			if l, err := netlink.LinkByName("cilium_vxlan"); err == nil {
				if err := netlink.LinkDel(l); err != nil {
					return err
				}
			}
			if err := netlink.LinkAdd(&netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: "cilium_vxlan", MTU: 1450}, FlowBased: true, Port: 8472}); err != nil {
				return err
			}
			l, err := netlink.LinkByName("cilium_vxlan")
			if err != nil {
				return err
			}
			idx = l.Attrs().Index
			return netlink.LinkSetUp(l)
		})
		if err != nil {
			t.Fatal(err)
		}
		return idx
	}
	check := func(ifindex int) map[string]ebpf.ProgramID {
		t.Helper()
		ids := map[string]ebpf.ProgramID{}
		for _, hk := range overlayHooks {
			l, err := link.LoadPinnedLink(filepath.Join(layout.OverlayDir(), hk.prog), nil)
			if err != nil {
				t.Fatalf("pinned link of %s: %v", hk.prog, err)
			}
			info, err := l.Info()
			l.Close()
			if err != nil {
				t.Fatal(err)
			}
			if tcx := info.TCX(); tcx == nil || int(tcx.Ifindex) != ifindex || ebpf.AttachType(tcx.AttachType) != hk.tcx {
				t.Errorf("link of %s: %+v, want tcx on ifindex %d", hk.prog, info.TCX(), ifindex)
			}
			prog, err := ebpf.NewProgramFromID(info.Program)
			if err != nil {
				t.Fatal(err)
			}
			pi, _ := prog.Info()
			prog.Close()
			// The kernel keeps 15 bytes of a name; BTF may give it whole.
			if pi.Name != hk.prog && pi.Name != hk.prog[:min(15, len(hk.prog))] {
				t.Errorf("link of %s runs %q", hk.prog, pi.Name)
			}
			ids[hk.prog] = info.Program
		}
		return ids
	}
	idx := mk()
	if err := o.Ensure("cilium_vxlan"); err != nil {
		t.Fatal(err)
	}
	first := check(idx)
	if err := o.Ensure("cilium_vxlan"); err != nil {
		t.Fatal(err)
	}
	if again := check(idx); again[bpf.OverlayProgCilFromOverlay] != first[bpf.OverlayProgCilFromOverlay] {
		t.Error("a second Ensure loaded the programs again")
	}
	idx2 := mk()
	if err := o.Ensure("cilium_vxlan"); err != nil {
		t.Fatal(err)
	}
	check(idx2)
	if err := o.Remove(); err != nil {
		t.Fatal(err)
	}
	for _, hk := range overlayHooks {
		if _, err := os.Stat(filepath.Join(layout.OverlayDir(), hk.prog)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("pin of %s left after Remove: %v", hk.prog, err)
		}
	}
}
