package bpfmaps_test

import (
	"encoding/json"
	"errors"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/statedb"
	"golang.org/x/sys/unix"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	ipcachecell "github.com/cellium/cellium/cells/ipcache"
	"github.com/cellium/cellium/daemon/bpfmaps"
	"github.com/cellium/cellium/datapath/bpf"
	"github.com/cellium/cellium/datapath/ctgc"
	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/ipcache"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/mapstate"
	"github.com/cellium/cellium/statedb/nodes"
	"github.com/cellium/cellium/statedb/policy"
	"github.com/cellium/cellium/statedb/reconciler"
	"github.com/cellium/cellium/test/privileged"
)

// The cell as the agent composes it, with the ipcache cell, on a bpffs of
// the test's own: an endpoint, its policy and the local node end up in the
// pinned maps (the ipcache through the control plane's derivation), the
// policy-maps row says which revision the map holds, and bpftool sees the
// entries. The conntrack GC job deletes an expired conntrack entry and
// keeps an alive one.
func TestPrivilegedMapSyncCell(t *testing.T) {
	privileged.Require(t)
	root := filepath.Join(t.TempDir(), "mapsync-cell-bpffs")
	if err := maps.EnsureBPFFS(root); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(root, 0); err != nil {
			t.Errorf("unmount %s: %v", root, err)
		}
	})
	var (
		db    *statedb.DB
		eps   statedb.RWTable[*endpoints.Endpoint]
		pols  statedb.RWTable[*policy.EndpointPolicyRow]
		local statedb.RWTable[*nodes.LocalNode]
		ipc   statedb.Table[*ipcache.Entry]
		pmaps statedb.Table[*mapstate.PolicyMap]
		lxc   statedb.Table[*mapstate.Endpoint]
	)
	hivetest.Start(t, []string{"--enable-bpf-datapath", "--bpf-root=" + root, "--conntrack-gc-interval=20ms"},
		// Stand-ins for the endpoint manager's, the policy cell's, node
		// discovery's and the k8s cells' tables.
		hive.Provide(endpoints.NewTable, policy.NewTable, policy.NewCIDRTable, nodes.NewLocalNodeTable, nodes.NewNodesTable,
			k8stables.NewCiliumEndpointsTable,
			statedb.RWTable[*endpoints.Endpoint].ToTable, statedb.RWTable[*policy.EndpointPolicyRow].ToTable,
			statedb.RWTable[*policy.CIDRIdentity].ToTable, statedb.RWTable[*nodes.LocalNode].ToTable,
			statedb.RWTable[*nodes.Node].ToTable, statedb.RWTable[*ciliumv2.CiliumEndpoint].ToTable),
		ipcachecell.Cell, bpfmaps.Cell,
		hivetest.Capture(&db), hivetest.Capture(&eps), hivetest.Capture(&pols), hivetest.Capture(&ipc), hivetest.Capture(&local),
		hivetest.Capture(&pmaps), hivetest.Capture(&lxc),
	)
	ep := netip.MustParseAddr("10.214.3.5")
	web := policy.NewKey(1000, policy.Ingress, policy.ProtoTCP, 80, 16)
	router := netip.MustParseAddr("10.214.3.1")
	wtxn := db.WriteTxn(eps, pols, local)
	_, _, _ = local.Insert(wtxn, &nodes.LocalNode{Name: "node", InternalIP: netip.MustParseAddr("192.168.214.3"), RouterIP: router})
	_, _, _ = eps.Insert(wtxn, &endpoints.Endpoint{ID: 5, IPv4: ep, HostIfIndex: 42, MAC: "02:00:00:00:00:05", Identity: 1234})
	_, _, _ = pols.Insert(wtxn, &policy.EndpointPolicyRow{EndpointID: 5, Identity: 1234, Policy: &policy.EndpointPolicy{
		Revision: 9,
		Ingress:  policy.DirectionPolicy{Enforcing: true, Entries: []policy.Entry{{Key: web}}},
		Egress:   policy.DirectionPolicy{Entries: []policy.Entry{{Key: policy.NewKey(0, policy.Egress, 0, 0, 0)}}},
	}})
	wtxn.Commit()

	timeout := time.After(15 * time.Second)
	for {
		txn := db.ReadTxn()
		pm, _, ok1 := pmaps.Get(txn, mapstate.PolicyEndpointIndex.Query(5))
		lx, _, ok2 := lxc.Get(txn, mapstate.EndpointIPIndex.Query(ep))
		ic, _, ok3 := ipc.Get(txn, ipcache.PrefixIndex.Query(netip.PrefixFrom(ep, 32)))
		_, w1 := pmaps.AllWatch(txn)
		_, w2 := lxc.AllWatch(txn)
		_, w3 := ipc.AllWatch(txn)
		if ok1 && ok2 && ok3 && pm.RealizedAt(9) && lx.Status.Kind == reconciler.StatusDone && ic.Status.Kind == reconciler.StatusDone {
			break
		}
		select {
		case <-w1:
		case <-w2:
		case <-w3:
		case <-timeout:
			t.Fatalf("not reconciled within 15s: policy-maps %+v, lxc-map %+v, ipcache %+v", pm, lx, ic)
		}
	}

	dir := filepath.Join(root, "cellium")
	m, err := maps.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if got, err := m.IPCache.Lookup(netip.PrefixFrom(ep, 32)); err != nil || got.Identity != 1234 {
		t.Errorf("ipcache %s: %+v, %v", ep, got, err)
	}
	if got, err := m.IPCache.Lookup(netip.PrefixFrom(router, 32)); err != nil || got.Identity != 1 {
		t.Errorf("ipcache %s (router IP): %+v, %v, want host (1)", router, got, err)
	}
	if got, err := m.Endpoints.Lookup(ep); err != nil || got.ID != 5 || got.IfIndex != 42 {
		t.Errorf("lxc %s: %+v, %v", ep, got, err)
	}
	pm, err := maps.OpenPolicyMap(dir, 5)
	if err != nil {
		t.Fatal(err)
	}
	defer pm.Close()
	if v, err := pm.Lookup(web); err != nil || v.Deny {
		t.Errorf("policy %s: %+v, %v", web, v, err)
	}
	out, err := exec.Command("bpftool", "-j", "map", "dump", "pinned", filepath.Join(dir, maps.PolicyMapPinName(5))).Output()
	if err != nil {
		t.Fatalf("bpftool: %v", err)
	}
	var entries []json.RawMessage
	if err := json.Unmarshal(out, &entries); err != nil || len(entries) != 2 {
		t.Errorf("bpftool shows %d policy entries (want 2): %v %s", len(entries), err, strings.TrimSpace(string(out)))
	}

	now, err := ctgc.Monotonic()
	if err != nil {
		t.Fatal(err)
	}
	expired := bpf.LxcCt4Key{Saddr: 0x0a000001, Daddr: 0x0a000002, Sport: 1, Dport: 80, Proto: 6}
	alive := bpf.LxcCt4Key{Saddr: 0x0a000001, Daddr: 0x0a000002, Sport: 2, Dport: 80, Proto: 6}
	for k, deadline := range map[bpf.LxcCt4Key]uint64{expired: now - 1e9, alive: now + 600e9} {
		if err := m.CT4.Map().Update(&k, &bpf.LxcCtEntry{Expires: deadline}, ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var v bpf.LxcCtEntry
		if err := m.CT4.Map().Lookup(&expired, &v); errors.Is(err, ebpf.ErrKeyNotExist) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the conntrack GC job did not delete an expired entry within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	var v bpf.LxcCtEntry
	if err := m.CT4.Map().Lookup(&alive, &v); err != nil {
		t.Errorf("the alive conntrack entry: %v", err)
	}
}
