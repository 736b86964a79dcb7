package ctgc

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/datapath/bpf"
	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/test/privileged"
)

// A pass over the real cellium_ct4 pinned in a bpffs of the test's own,
// with deadlines on the programs' clock: the expired entries go, the
// alive ones stay, and the metrics say so.
func TestPrivilegedGC(t *testing.T) {
	privileged.Require(t)
	dir := filepath.Join(t.TempDir(), "ctgc-bpffs")
	if err := maps.EnsureBPFFS(dir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	m, err := maps.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()

	now, err := Monotonic()
	if err != nil {
		t.Fatal(err)
	}
	const alive, expired = 400, 600
	var keys []bpf.LxcCt4Key
	var vals []bpf.LxcCtEntry
	for i := range alive + expired {
		keys = append(keys, bpf.LxcCt4Key{Saddr: uint32(0x0a000000 + i), Daddr: 0x0a010001, Sport: uint16(i), Dport: 80, Proto: 6})
		deadline := now + 60e9
		if i >= alive {
			deadline = now - 1e9
		}
		vals = append(vals, bpf.LxcCtEntry{Expires: deadline, TxPackets: 1})
	}
	for i := range keys {
		if err := m.CT4.Map().Update(&keys[i], &vals[i], ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
	}
	reg := prometheus.NewPedanticRegistry()
	metrics, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	capacity := int(m.CT4.Map().MaxEntries())
	res, err := New(m.CT4, maps.CT4MapName, capacity, Monotonic, metrics).Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("pass over %d entries of a map of %d: %+v", alive+expired, capacity, res)
	if res.Alive != alive || res.Deleted != expired {
		t.Errorf("result %+v, want %d alive, %d deleted", res, alive, expired)
	}
	left := 0
	if err := m.CT4.Iterate(func(k maps.CTKey, e maps.CTEntry) bool {
		left++
		if e.Expires <= now {
			t.Errorf("expired entry %+v left", k)
		}
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if left != alive {
		t.Errorf("%d entries left, want %d", left, alive)
	}
	got := gather(t, reg)
	if v := got[`cellium_datapath_conntrack_gc_entries{family="ipv4",status="deleted"}`]; v != expired {
		t.Errorf("deleted gauge %v, want %d", v, expired)
	}
	if v, want := got[`cellium_bpf_map_pressure{map_name="cellium_ct4"}`], float64(alive)/float64(capacity); v != want {
		t.Errorf("pressure %v, want %v", v, want)
	}
	// A second pass finds nothing to delete.
	if res, err := New(m.CT4, maps.CT4MapName, capacity, Monotonic, metrics).Run(context.Background()); err != nil || res.Deleted != 0 || res.Alive != alive {
		t.Errorf("second pass: %+v, %v", res, err)
	}
}

// The NodePort NAT maps are plain hashes too: a pass of NewExpiring over
// the real cellium_nodeport_ct4 and cellium_nodeport_rev4 deletes their
// expired entries (a SYN flood's, once CT_LIFETIME_SYN is over) and keeps
// the live ones, recording only the maps' pressure.
func TestPrivilegedGCNodePortNAT(t *testing.T) {
	privileged.Require(t)
	dir := filepath.Join(t.TempDir(), "ctgc-bpffs")
	if err := maps.EnsureBPFFS(dir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	m, err := maps.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if typ := m.NodePortCT4.Type(); typ != ebpf.Hash {
		t.Errorf("cellium_nodeport_ct4 is a %v, want a plain hash (an LRU evicts established connections under a flood)", typ)
	}
	if typ := m.NodePortRev4.Type(); typ != ebpf.Hash {
		t.Errorf("cellium_nodeport_rev4 is a %v, want a plain hash", typ)
	}
	now, err := Monotonic()
	if err != nil {
		t.Fatal(err)
	}
	const alive, expired = 300, 700
	for i := range alive + expired {
		deadline := now + 60e9
		if i >= alive {
			deadline = now - 1e9
		}
		fk := bpf.NodeportNodeportCt4Key{Client: uint32(0x0a000000 + i), Frontend: 0x0a010001, ClientPort: uint16(i), FrontendPort: 80, Proto: 6}
		if err := m.NodePortCT4.Update(&fk, &bpf.NodeportNodeportCt4Entry{Expires: deadline}, ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
		rk := bpf.NodeportNodeportRev4Key{Backend: 0x0a020002, NatAddr: 0x0a010001, BackendPort: 80, NatPort: uint16(i), Proto: 6}
		if err := m.NodePortRev4.Update(&rk, &bpf.NodeportNodeportRev4Entry{Expires: deadline}, ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
	}
	reg := prometheus.NewPedanticRegistry()
	metrics, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	ct, rev := m.NodePortCT4Expiry(), m.NodePortRev4Expiry()
	for _, g := range []*GC{
		NewExpiring(ct, maps.NodePortCT4MapName, ct.Capacity(), Monotonic, metrics),
		NewExpiring(rev, maps.NodePortRev4MapName, rev.Capacity(), Monotonic, metrics),
	} {
		res, err := g.Run(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if res.Alive != alive || res.Deleted != expired {
			t.Errorf("%s: result %+v, want %d alive, %d deleted", g.name, res, alive, expired)
		}
	}
	left := 0
	if err := ct.Iterate(func(_ bpf.NodeportNodeportCt4Key, e uint64) bool {
		left++
		if e <= now {
			t.Errorf("expired entry left")
		}
		return true
	}); err != nil || left != alive {
		t.Errorf("cellium_nodeport_ct4: %d entries left, want %d (%v)", left, alive, err)
	}
	got := gather(t, reg)
	if v, want := got[`cellium_bpf_map_pressure{map_name="cellium_nodeport_rev4"}`], float64(alive)/float64(rev.Capacity()); v != want {
		t.Errorf("pressure %v, want %v", v, want)
	}
	if _, ok := got[`cellium_datapath_conntrack_gc_entries{family="ipv4",status="deleted"}`]; ok {
		t.Error("a NAT map's pass set the conntrack entries gauge")
	}
}
