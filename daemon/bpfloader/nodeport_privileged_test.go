package bpfloader

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/statedb"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/datapath/loader"
	"github.com/cellium/cellium/test/privileged"
)

// TestPrivilegedNodePortJob: with the kube-proxy replacement on and no
// --devices, the attach-nodeport job attaches cil_from_netdev to the
// device of the default route; off, it removes what an earlier run left.
func TestPrivilegedNodePortJob(t *testing.T) {
	privileged.Require(t)
	layout := loader.Layout{Root: t.TempDir()}
	if err := layout.MountBPFFS(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(layout.Root, 0); err != nil {
			t.Errorf("unmount: %v", err)
		}
	})
	node, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = node.Close(); _ = testutils.UnmountNS(node) })
	if err := node.Do(func(ns.NetNS) error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "uplink0"}, PeerName: "uplink0p"}); err != nil {
			return err
		}
		for _, n := range []string{"uplink0", "uplink0p"} {
			l, err := netlink.LinkByName(n)
			if err == nil {
				err = netlink.LinkSetUp(l)
			}
			if err != nil {
				return err
			}
		}
		l, err := netlink.LinkByName("uplink0")
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(10, 79, 9, 1), Mask: net.CIDRMask(24, 32)}}); err != nil {
			return err
		}
		return netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: net.IPv4(10, 79, 9, 254)})
	}); err != nil {
		t.Fatal(err)
	}
	db := statedb.New()
	np := &loader.NodePort{Layout: layout, Netns: loader.Netns{Path: node.Path()}}
	pin := filepath.Join(layout.NodePortDir(), "uplink0")

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		runNodePort(ctx, nopHealth{}, db, nil, loader.NodePortConfig{KubeProxyReplacement: true}, np)
	}()
	waitFor(t, "the nodeport link pinned on the default route's device", func() bool {
		_, err := os.Stat(pin)
		return err == nil
	})
	cancel()
	<-done

	off := &loader.NodePort{Layout: layout, Netns: loader.Netns{Path: node.Path()}}
	runNodePort(context.Background(), nopHealth{}, db, nil, loader.NodePortConfig{}, off)
	if _, err := os.Stat(pin); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("nodeport link still pinned with the replacement off: %v", err)
	}
}
