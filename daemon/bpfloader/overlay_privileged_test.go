package bpfloader

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/cilium/statedb"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/datapath/bpf"
	"github.com/cellium/cellium/datapath/loader"
	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/statedb/identity"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/reconciler"
	"github.com/cellium/cellium/statedb/routes"
	"github.com/cellium/cellium/test/privileged"
)

type nopHealth struct{}

func (nopHealth) OK(string)              {}
func (nopHealth) Degraded(string, error) {}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestPrivilegedOverlayJobs: the attach-overlay job attaches the overlay
// programs once the tunnel device's row is reconciled and removes them
// when the (initialized) devices table no longer has it; the
// sync-identities-map job mirrors the CiliumIdentity table into
// cellium_identities.
func TestPrivilegedOverlayJobs(t *testing.T) {
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
		return netlink.LinkAdd(&netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: routes.TunnelDevice}, FlowBased: true, Port: 8472})
	}); err != nil {
		t.Fatal(err)
	}

	db := statedb.New()
	devs, err := routes.NewDevicesTable(db)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := k8stables.NewCiliumIdentitiesTable(db)
	if err != nil {
		t.Fatal(err)
	}
	wtxn := db.WriteTxn(devs)
	initDone := devs.RegisterInitializer(wtxn, "test")
	wtxn.Commit()

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	o := &loader.Overlay{Layout: layout, Netns: loader.Netns{Path: node.Path()}}
	go func() { defer wg.Done(); runOverlay(ctx, nopHealth{}, db, devs, o) }()
	go func() { defer wg.Done(); runIdentities(ctx, nopHealth{}, db, ids, layout) }()
	t.Cleanup(func() { cancel(); wg.Wait() })

	pin := filepath.Join(layout.OverlayDir(), bpf.OverlayProgCilFromOverlay)
	pinned := func() bool { _, err := os.Stat(pin); return err == nil }

	// Pending: nothing yet.
	wtxn = db.WriteTxn(devs)
	row := &routes.Device{Name: routes.TunnelDevice, Kind: routes.KindVXLAN, Port: 8472, Status: reconciler.Pending()}
	_, _, _ = devs.Insert(wtxn, row)
	initDone(wtxn)
	wtxn.Commit()
	time.Sleep(200 * time.Millisecond)
	if pinned() {
		t.Error("programs attached before the device was reconciled")
	}
	wtxn = db.WriteTxn(devs)
	_, _, _ = devs.Insert(wtxn, row.WithStatus(reconciler.Done()))
	wtxn.Commit()
	waitFor(t, "the overlay links pinned", pinned)

	wtxn = db.WriteTxn(ids)
	for _, name := range []string{"70001", "70002"} {
		ci := &ciliumv2.CiliumIdentity{}
		ci.Name = name
		_, _, _ = ids.Insert(wtxn, ci)
	}
	wtxn.Commit()
	m, err := maps.Open(layout.Dir())
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	waitFor(t, "cellium_identities filled", func() bool {
		a, _ := m.Identities.Has(identity.NumericIdentity(70001))
		b, _ := m.Identities.Has(identity.NumericIdentity(70002))
		return a && b
	})

	wtxn = db.WriteTxn(devs)
	_, _, _ = devs.Delete(wtxn, row)
	wtxn.Commit()
	waitFor(t, "the overlay links removed", func() bool {
		_, err := os.Stat(pin)
		return errors.Is(err, os.ErrNotExist)
	})
}
