package datapathmonitor

import (
	"context"
	"net"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/api/v1/client"
	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/cells/agentapi"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/metrics"
	cellmonitor "github.com/cellium/cellium/cells/monitor"
	"github.com/cellium/cellium/datapath/bpf"
	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/test/privileged"
)

// The test's own addresses, only inside the namespaces it makes.
var (
	nodeAddr = netip.MustParseAddr("10.251.77.1")
	podAddr  = netip.MustParseAddr("10.251.77.2")
)

const (
	testEndpoint = 3917
	testIdentity = 48213
	testPort     = 9999
)

// TestPrivilegedDropReachesMonitor loads cellium's real endpoint program
// on the host side of a veth (in namespaces of the test) with an empty
// policy map, sends one UDP datagram to the "pod", and follows the drop
// from the kernel's ring buffer through the cell and the hub to a GET
// /v1/monitor stream, and into cellium_drop_count_total.
func TestPrivilegedDropReachesMonitor(t *testing.T) {
	privileged.Require(t)

	// The agent's bpffs directory, <bpf-root>/cellium, a bpffs of the
	// test's own; unmounted after the hive stops (cleanups run in
	// reverse).
	root := t.TempDir()
	dir := filepath.Join(root, "cellium")
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
	policy, err := maps.OpenPolicyMap(dir, testEndpoint)
	if err != nil {
		t.Fatal(err)
	}
	defer policy.Close()

	node, pod := newNetns(t), newNetns(t)
	hostIfindex := vethPair(t, node, pod)
	coll := loadProgram(t, m, policy, hostIfindex)
	defer coll.Close()
	var l link.Link
	if err := node.Do(func(ns.NetNS) error {
		var err error
		l, err = link.AttachTCX(link.TCXOptions{Interface: hostIfindex,
			Program: coll.Programs["cil_to_container"], Attach: ebpf.AttachTCXEgress})
		return err
	}); err != nil {
		t.Fatalf("attach cil_to_container (tcx egress): %v", err)
	}
	defer l.Close()

	// The agent: API, metrics, the hub and this cell, with the loader's
	// flags pointing at the test's bpffs.
	sock := filepath.Join(t.TempDir(), "api.sock")
	var reg *prometheus.Registry
	hivetest.Start(t, []string{"--socket-path=" + sock, "--bpf-root=" + root},
		fakeLoader, metrics.Cell, agentapi.Cell, cellmonitor.Cell, Cell, hivetest.Capture(&reg))

	c := client.New(sock)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stream, err := c.Monitor(ctx, []string{"drop", "policy-verdict"}, []uint16{testEndpoint})
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()

	if err := node.Do(func(ns.NetNS) error {
		conn, err := net.Dial("udp4", netip.AddrPortFrom(podAddr, testPort).String())
		if err != nil {
			return err
		}
		defer conn.Close()
		_, err = conn.Write([]byte("denied"))
		return err
	}); err != nil {
		t.Fatal(err)
	}

	common := models.MonitorEvent{EndpointID: testEndpoint, Direction: "ingress", SrcIdentity: 2, DstIdentity: testIdentity,
		SrcIP: nodeAddr.String(), DstIP: podAddr.String(), DstPort: testPort, Protocol: "udp", Ifindex: uint32(hostIfindex)}
	verdict, drop := common, common
	verdict.Type, verdict.Verdict, verdict.ReasonCode, verdict.Reason = "policy-verdict", "deny", 133, "Policy denied"
	drop.Type, drop.ReasonCode, drop.Reason = "drop", 133, "Policy denied"
	for _, want := range []models.MonitorEvent{verdict, drop} {
		got, err := stream.Next()
		if err != nil {
			t.Fatalf("waiting for the %s event: %v", want.Type, err)
		}
		if got.Timestamp.IsZero() || time.Since(got.Timestamp).Abs() > time.Hour {
			t.Errorf("%s event's timestamp %v is not about now", got.Type, got.Timestamp)
		}
		// What the test cannot know beforehand: the time, the source
		// port the kernel chose, the packet's length.
		want.Timestamp, want.SrcPort, want.Length = got.Timestamp, got.SrcPort, got.Length
		if got.SrcPort == 0 || got.Length < 28+6 {
			t.Errorf("%s event: source port %d, length %d", got.Type, got.SrcPort, got.Length)
		}
		if got != want {
			t.Errorf("event:\n got %+v\nwant %+v", got, want)
		}
	}

	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var drops float64
	for _, mf := range mfs {
		if mf.GetName() != "cellium_drop_count_total" {
			continue
		}
		for _, metric := range mf.GetMetric() {
			labels := map[string]string{}
			for _, lp := range metric.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			if labels["reason"] == "Policy denied" && labels["direction"] == "INGRESS" {
				drops = metric.GetCounter().GetValue()
			}
		}
	}
	if drops < 1 {
		t.Errorf(`cellium_drop_count_total{reason="Policy denied",direction="INGRESS"} = %v, want at least 1`, drops)
	}
}

func newNetns(t *testing.T) ns.NetNS {
	t.Helper()
	n, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = n.Close()
		if err := testutils.UnmountNS(n); err != nil {
			t.Errorf("remove netns %s: %v", n.Path(), err)
		}
	})
	return n
}

// vethPair makes a veth between node (host side "cmon0", nodeAddr/24) and
// pod ("eth0", podAddr/24), both up, and returns the host side's ifindex.
// The namespaces' deletion removes it.
func vethPair(t *testing.T, node, pod ns.NetNS) int {
	t.Helper()
	var ifindex int
	err := node.Do(func(ns.NetNS) error {
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "cmon0"}, PeerName: "cmon0p"}
		if err := netlink.LinkAdd(veth); err != nil {
			return err
		}
		host, err := netlink.LinkByName("cmon0")
		if err != nil {
			return err
		}
		peer, err := netlink.LinkByName("cmon0p")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetNsFd(peer, int(pod.Fd())); err != nil {
			return err
		}
		if err := netlink.AddrAdd(host, &netlink.Addr{IPNet: &net.IPNet{IP: nodeAddr.AsSlice(), Mask: net.CIDRMask(24, 32)}}); err != nil {
			return err
		}
		ifindex = host.Attrs().Index
		return netlink.LinkSetUp(host)
	})
	if err != nil {
		t.Fatalf("make the veth: %v", err)
	}
	err = pod.Do(func(ns.NetNS) error {
		peer, err := netlink.LinkByName("cmon0p")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetName(peer, "eth0"); err != nil {
			return err
		}
		if err := netlink.AddrAdd(peer, &netlink.Addr{IPNet: &net.IPNet{IP: podAddr.AsSlice(), Mask: net.CIDRMask(24, 32)}}); err != nil {
			return err
		}
		return netlink.LinkSetUp(peer)
	})
	if err != nil {
		t.Fatalf("set up the pod side: %v", err)
	}
	return ifindex
}

// loadProgram loads the endpoint programs with the test endpoint's
// constants and the maps of dir, as the loader does.
func loadProgram(t *testing.T, m *maps.Maps, policy *maps.PolicyMap, ifindex int) *ebpf.Collection {
	t.Helper()
	spec, err := bpf.LoadLxc()
	if err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]any{
		"ENDPOINT_ID":       uint16(testEndpoint),
		"SECURITY_IDENTITY": uint32(testIdentity),
		"ENDPOINT_IFINDEX":  uint32(ifindex),
	} {
		vs, ok := spec.Variables[name]
		if !ok {
			t.Fatalf("the program has no constant %s", name)
		}
		if err := vs.Set(v); err != nil {
			t.Fatalf("set %s: %v", name, err)
		}
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{MapReplacements: m.Replacements(policy)})
	if err != nil {
		t.Fatalf("load the endpoint programs: %v", err)
	}
	return coll
}
