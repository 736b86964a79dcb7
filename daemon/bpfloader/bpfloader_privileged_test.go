package bpfloader_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/statedb"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/daemon/bpfloader"
	dplink "github.com/cellium/cellium/datapath/link"
	"github.com/cellium/cellium/datapath/loader"
	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/statedb/bpfprog"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/reconciler"
	"github.com/cellium/cellium/test/privileged"
)

func newTestNS(t *testing.T) ns.NetNS {
	t.Helper()
	n, err := testutils.NewNS()
	if err != nil {
		t.Fatalf("create netns: %v", err)
	}
	t.Cleanup(func() {
		_ = n.Close()
		if err := testutils.UnmountNS(n); err != nil {
			t.Errorf("remove netns %s: %v", n.Path(), err)
		}
	})
	return n
}

// agent is one run of the loader cell (as the agent composes it, with the
// real programs and maps) over a stand-in endpoints table.
type agent struct {
	h    *hive.Hive
	db   *statedb.DB
	eps  statedb.RWTable[*endpoints.Endpoint]
	rows statedb.Table[*bpfprog.Program]
}

func startAgent(t *testing.T, node ns.NetNS, root string, seed []*endpoints.Endpoint) *agent {
	t.Helper()
	a := &agent{}
	// The endpoints table is initialized only once the seed (the agent's
	// restored endpoints) is in, as in the agent: otherwise the first full
	// reconciliation may prune the seed's pinned links before it is seen.
	var restored func(statedb.WriteTxn)
	a.h = hivetest.New(t, []string{"--bpf-root=" + root},
		hive.Provide(endpoints.NewTable, statedb.RWTable[*endpoints.Endpoint].ToTable),
		hive.Invoke(func(db *statedb.DB, eps statedb.RWTable[*endpoints.Endpoint]) {
			wtxn := db.WriteTxn(eps)
			restored = eps.RegisterInitializer(wtxn, "restore")
			wtxn.Commit()
		}),
		bpfloader.NewCell(loader.Netns{Path: node.Path()}, bpfloader.Sources{
			Spec:     loader.LoadSpec,
			OpenMaps: func(dir string) bpfloader.ClosableMaps { return loader.NewPinnedMaps(dir) },
		}),
		hivetest.Capture(&a.db), hivetest.Capture(&a.eps), hivetest.Capture(&a.rows),
	)
	if err := a.h.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	wtxn := a.db.WriteTxn(a.eps)
	for _, ep := range seed {
		_, _, _ = a.eps.Insert(wtxn, ep)
	}
	restored(wtxn)
	wtxn.Commit()
	return a
}

func (a *agent) stop(t *testing.T) {
	t.Helper()
	if err := a.h.Stop(context.Background()); err != nil {
		t.Errorf("stop hive: %v", err)
	}
}

// waitDone waits until the table holds exactly n rows, all reconciled.
func (a *agent) waitDone(t *testing.T, n int) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		it, watch := a.rows.AllWatch(a.db.ReadTxn())
		var rows []*bpfprog.Program
		done := 0
		for r := range it {
			rows = append(rows, r)
			if r.Status.Kind == reconciler.StatusDone {
				done++
			}
		}
		if len(rows) == n && done == n {
			return
		}
		select {
		case <-watch:
		case <-deadline:
			for _, r := range rows {
				t.Logf("row %d: %s", r.EndpointID, r.Status)
			}
			t.Fatalf("want %d reconciled rows, have %d of %d", n, done, len(rows))
		}
	}
}

type hookProg struct {
	prog ebpf.ProgramID
	link link.ID
	name string
}

// attached lists the programs at both tcx hooks of ifindex in node.
func attached(t *testing.T, node ns.NetNS, ifindex int) (out [2][]hookProg) {
	t.Helper()
	err := node.Do(func(ns.NetNS) error {
		for i, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
			res, err := link.QueryPrograms(link.QueryOptions{Target: ifindex, Attach: at})
			if err != nil {
				return err
			}
			for _, p := range res.Programs {
				lid, _ := p.LinkID()
				hp := hookProg{prog: p.ID, link: lid}
				if prog, err := ebpf.NewProgramFromID(p.ID); err == nil {
					if info, err := prog.Info(); err == nil {
						hp.name = info.Name
					}
					prog.Close()
				}
				out[i] = append(out[i], hp)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestPrivilegedLoaderCellRealPrograms runs the cell with the real
// programs (datapath/bpf, accepted by this kernel's verifier) and maps:
// an endpoint row gets cil_from_container and cil_to_container on its
// veth; with an empty policy map the programs drop the pod's packets
// (counted as "Policy denied" in the metrics map); a restarted agent
// replaces the programs in the same links; deleting the endpoint removes
// links, pins and policy map, and traffic flows again.
func TestPrivilegedLoaderCellRealPrograms(t *testing.T) {
	privileged.Require(t)
	root := t.TempDir()
	t.Cleanup(func() {
		if err := unix.Unmount(root, 0); err != nil {
			t.Errorf("unmount test bpffs: %v", err)
		}
	})
	router := netip.MustParseAddr("10.219.8.1")
	ips := []netip.Addr{netip.MustParseAddr("10.219.8.10"), netip.MustParseAddr("10.219.8.11")}
	node := newTestNS(t)
	var pods []ns.NetNS
	var res []dplink.Result
	for i, ip := range ips {
		pod := newTestNS(t)
		r, err := dplink.Host{NetnsPath: node.Path()}.SetupEndpoint(context.Background(), dplink.Spec{
			ContainerID: fmt.Sprintf("bpfloader-test-%d-%d", os.Getpid(), i), NetnsPath: pod.Path(),
			IPv4: ip.AsSlice(), Gateway: router.AsSlice(),
		})
		if err != nil {
			t.Fatal(err)
		}
		pods, res = append(pods, pod), append(res, r)
	}
	err := node.Do(func(ns.NetNS) error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(lo); err != nil {
			return err
		}
		if err := netlink.AddrAdd(lo, &netlink.Addr{IPNet: &net.IPNet{IP: router.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
			return err
		}
		for i, r := range res {
			if err := netlink.RouteAdd(&netlink.Route{LinkIndex: r.HostIfIndex, Scope: netlink.SCOPE_LINK,
				Dst: &net.IPNet{IP: ips[i].AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
				return err
			}
		}
		return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1\n"), 0)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := privileged.Ping(pods[0], ips[1]); err != nil {
		t.Fatalf("pods do not reach each other before any program: %v", err)
	}

	epA := &endpoints.Endpoint{ID: 41, IPv4: ips[0], HostIfName: res[0].HostIfName, HostIfIndex: res[0].HostIfIndex,
		MAC: res[0].PodMAC.String(), Identity: 70001, State: ciliumv2.EndpointStateRegenerating}
	a := startAgent(t, node, root, []*endpoints.Endpoint{epA})
	a.waitDone(t, 1)
	first := attached(t, node, res[0].HostIfIndex)
	for i, want := range []string{loader.ProgFromContainer, loader.ProgToContainer} {
		if len(first[i]) != 1 || first[i][0].link == 0 || first[i][0].name != want {
			t.Fatalf("hook %d of %s: %+v, want one linked %s", i, res[0].HostIfName, first[i], want)
		}
	}
	layout := loader.Layout{Root: root}
	for _, p := range []string{loader.ProgFromContainer, loader.ProgToContainer} {
		if _, err := os.Stat(layout.LinkPin(epA.ID, p)); err != nil {
			t.Errorf("pinned link: %v", err)
		}
	}
	policyPin := filepath.Join(layout.Dir(), maps.PolicyMapPinName(epA.ID))
	if _, err := os.Stat(policyPin); err != nil {
		t.Errorf("policy map pin: %v", err)
	}

	// No policy entry: the program drops the pod's packets ("Policy
	// denied", 133), as the ABI says.
	if err := privileged.Ping(pods[0], ips[1]); err == nil {
		t.Error("a pod with an empty policy map reached another pod")
	}
	global, err := maps.Open(layout.Dir())
	if err != nil {
		t.Fatal(err)
	}
	defer global.Close()
	// The same-node redirect's slot of the endpoint holds its ingress
	// policy program.
	if has, err := global.PolicyProgs.Has(epA.ID); err != nil || !has {
		t.Errorf("redirect slot of endpoint %d: filled %v (%v), want filled", epA.ID, has, err)
	}
	counters, err := global.Metrics.Read()
	if err != nil {
		t.Fatal(err)
	}
	if c := counters[maps.MetricsKey{Reason: 133, Dir: maps.DirEgress}]; c.Packets == 0 {
		t.Errorf("no egress drop counted for reason 133: %+v", counters)
	}

	// A restarted agent over the same bpffs: new programs, same links.
	a.stop(t)
	a = startAgent(t, node, root, []*endpoints.Endpoint{epA})
	a.waitDone(t, 1)
	second := attached(t, node, res[0].HostIfIndex)
	for i := range second {
		if len(second[i]) != 1 || second[i][0].link != first[i][0].link || second[i][0].prog == first[i][0].prog {
			t.Errorf("hook %d after restart: %+v, want a new program in link %d", i, second[i], first[i][0].link)
		}
	}

	// The endpoint goes: so do its programs, pins and policy map.
	wtxn := a.db.WriteTxn(a.eps)
	_, _, _ = a.eps.Delete(wtxn, epA)
	wtxn.Commit()
	a.waitDone(t, 0)
	gone := func(p string) bool { _, err := os.Stat(p); return os.IsNotExist(err) }
	deadline := time.Now().Add(10 * time.Second)
	for {
		// The row is gone before the reconciler's delete runs: wait for
		// the kernel and the bpffs to show it done.
		got := attached(t, node, res[0].HostIfIndex)
		slotted, _ := global.PolicyProgs.Has(epA.ID)
		if len(got[0]) == 0 && len(got[1]) == 0 && gone(layout.EndpointDir(epA.ID)) && gone(policyPin) && !slotted {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the endpoint was deleted: programs %+v, endpoint dir gone %v, policy map pin gone %v, redirect slot filled %v",
				got, gone(layout.EndpointDir(epA.ID)), gone(policyPin), slotted)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := privileged.Ping(pods[0], ips[1]); err != nil {
		t.Errorf("pods do not reach each other after the programs were removed: %v", err)
	}
	a.stop(t)
}
