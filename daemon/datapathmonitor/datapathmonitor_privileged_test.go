package datapathmonitor

import (
	"context"
	"encoding/json"
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
	"github.com/cellium/cellium/statedb/policy"
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

// datapath is cellium's real endpoint program on the host side of a veth
// between two namespaces of the test ("node" and "pod"), its maps in a
// bpffs of the test's own, and an agent (API, metrics, the hub and this
// cell) reading them.
type datapath struct {
	t      *testing.T
	node   ns.NetNS
	policy *maps.PolicyMap
	reg    *prometheus.Registry
	client *client.Client
	ifidx  int
}

// newDatapath sets it all up; allow are the endpoint's policy entries
// (none: every packet to the pod is denied), trace loads the program with
// traces on. Everything is removed when the test ends.
func newDatapath(t *testing.T, trace bool, allow ...policy.Entry) *datapath {
	t.Helper()
	privileged.Require(t)
	d := &datapath{t: t}

	// The agent's bpffs directory, <bpf-root>/cellium; unmounted after
	// the hive stops (cleanups run in reverse).
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
	t.Cleanup(func() { m.Close() })
	if d.policy, err = maps.OpenPolicyMap(dir, testEndpoint); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.policy.Close() })
	for _, e := range allow {
		if err := d.policy.Update(e); err != nil {
			t.Fatal(err)
		}
	}

	d.node = newNetns(t)
	pod := newNetns(t)
	d.ifidx = vethPair(t, d.node, pod)
	coll := loadProgram(t, m, d.policy, d.ifidx, trace)
	t.Cleanup(coll.Close)
	var l link.Link
	if err := d.node.Do(func(ns.NetNS) error {
		var err error
		l, err = link.AttachTCX(link.TCXOptions{Interface: d.ifidx,
			Program: coll.Programs["cil_to_container"], Attach: ebpf.AttachTCXEgress})
		return err
	}); err != nil {
		t.Fatalf("attach cil_to_container (tcx egress): %v", err)
	}
	t.Cleanup(func() { l.Close() })

	sock := filepath.Join(t.TempDir(), "api.sock")
	hivetest.Start(t, []string{"--socket-path=" + sock, "--bpf-root=" + root},
		fakeLoader, metrics.Cell, agentapi.Cell, cellmonitor.Cell, Cell, hivetest.Capture(&d.reg))
	d.client = client.New(sock)
	t.Cleanup(d.client.Close)
	return d
}

// monitor opens GET /v1/monitor for the test endpoint's events of types.
func (d *datapath) monitor(types ...string) *client.MonitorStream {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	d.t.Cleanup(cancel)
	stream, err := d.client.Monitor(ctx, types, []uint16{testEndpoint})
	if err != nil {
		d.t.Fatal(err)
	}
	d.t.Cleanup(func() { stream.Close() })
	return stream
}

// sendUDP sends one datagram from the node to the pod's testPort.
func (d *datapath) sendUDP() {
	d.t.Helper()
	if err := d.node.Do(func(ns.NetNS) error {
		conn, err := net.Dial("udp4", netip.AddrPortFrom(podAddr, testPort).String())
		if err != nil {
			return err
		}
		defer conn.Close()
		_, err = conn.Write([]byte("monitor"))
		return err
	}); err != nil {
		d.t.Fatal(err)
	}
}

// expect reads the stream until it has seen each of want in order,
// skipping events of other packets (ARP, which the program passes and
// traces, carries no addresses). Fields the test cannot know beforehand
// (time, source port, length) are checked for plausibility and copied.
func (d *datapath) expect(stream *client.MonitorStream, want ...models.MonitorEvent) {
	d.t.Helper()
	for _, w := range want {
		for {
			got, err := stream.Next()
			if err != nil {
				d.t.Fatalf("waiting for the %s event: %v", w.Type, err)
			}
			if got.Protocol != "udp" {
				continue
			}
			if got.Timestamp.IsZero() || time.Since(got.Timestamp).Abs() > time.Hour {
				d.t.Errorf("%s event's timestamp %v is not about now", got.Type, got.Timestamp)
			}
			if got.SrcPort == 0 || got.Length < 28+7 {
				d.t.Errorf("%s event: source port %d, length %d", got.Type, got.SrcPort, got.Length)
			}
			w.Timestamp, w.SrcPort, w.Length = got.Timestamp, got.SrcPort, got.Length
			// As JSON: the optional fields are pointers.
			gj, _ := json.Marshal(got)
			wj, _ := json.Marshal(w)
			if string(gj) != string(wj) {
				d.t.Errorf("event:\n got %s\nwant %s", gj, wj)
			}
			break
		}
	}
}

// counter returns the value of metric name with labels.
func (d *datapath) counter(name string, labels map[string]string) float64 {
	d.t.Helper()
	mfs, err := d.reg.Gather()
	if err != nil {
		d.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, metric := range mf.GetMetric() {
			for _, lp := range metric.GetLabel() {
				if labels[lp.GetName()] != lp.GetValue() {
					continue metrics
				}
			}
			return metric.GetCounter().GetValue()
		}
	}
	return 0
}

// udpEvent is the datagram's event as the endpoint's ingress program
// sees it: from the node (world: unknown to the ipcache) to the pod, not
// a reply (conntrack was consulted: the datagram opens a connection).
func (d *datapath) udpEvent(typ string) models.MonitorEvent {
	notReply := false
	return models.MonitorEvent{Type: typ, EndpointID: testEndpoint, Direction: "ingress", SrcIdentity: 2,
		DstIdentity: testIdentity, SrcIP: nodeAddr.String(), DstIP: podAddr.String(), DstPort: testPort,
		Protocol: "udp", Ifindex: uint32(d.ifidx), IsReply: &notReply}
}

// TestPrivilegedDropReachesMonitor: with an empty policy map the program
// denies a UDP datagram to the pod; the policy verdict and the drop go
// from the kernel's ring buffer through the cell and the hub to a GET
// /v1/monitor stream, and the drop into cellium_drop_count_total.
func TestPrivilegedDropReachesMonitor(t *testing.T) {
	d := newDatapath(t, false)
	stream := d.monitor("drop", "policy-verdict")
	sent := time.Now()
	d.sendUDP()

	verdict, drop := d.udpEvent("policy-verdict"), d.udpEvent("drop")
	verdict.Verdict, verdict.ReasonCode, verdict.Reason = "deny", 133, "Policy denied"
	drop.ReasonCode, drop.Reason = 133, "Policy denied"
	d.expect(stream, verdict, drop)
	// A figure, not an assertion: ARP resolution included.
	t.Logf("the drop reached the API stream %v after the datagram was sent", time.Since(sent))

	if n := d.counter("cellium_drop_count_total", map[string]string{"reason": "Policy denied", "direction": "INGRESS"}); n < 1 {
		t.Errorf(`cellium_drop_count_total{reason="Policy denied",direction="INGRESS"} = %v, want at least 1`, n)
	}
}

// TestPrivilegedAllowAndTrace: with the datagram allowed by an L4 rule
// and traces on, the stream shows the allow verdict and the trace of the
// delivery to the endpoint, and the forward counter moves.
func TestPrivilegedAllowAndTrace(t *testing.T) {
	allow := policy.Entry{Key: policy.NewKey(2, policy.Ingress, 17, testPort, 16)}
	d := newDatapath(t, true, allow)
	stream := d.monitor("policy-verdict", "trace")
	d.sendUDP()

	verdict, trace := d.udpEvent("policy-verdict"), d.udpEvent("trace")
	verdict.Verdict = "allow"
	trace.ObservationPoint = "to-endpoint" // code 0
	d.expect(stream, verdict, trace)

	if n := d.counter("cellium_forward_count_total", map[string]string{"direction": "INGRESS"}); n < 1 {
		t.Errorf(`cellium_forward_count_total{direction="INGRESS"} = %v, want at least 1`, n)
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
func loadProgram(t *testing.T, m *maps.Maps, policy *maps.PolicyMap, ifindex int, trace bool) *ebpf.Collection {
	t.Helper()
	spec, err := bpf.LoadLxc()
	if err != nil {
		t.Fatal(err)
	}
	c := bpf.EndpointConstants{EndpointID: testEndpoint, Identity: testIdentity, IfIndex: uint32(ifindex), IPv4: podAddr, Trace: trace}
	if err := c.Apply(spec); err != nil {
		t.Fatal(err)
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{MapReplacements: m.Replacements(policy)})
	if err != nil {
		t.Fatalf("load the endpoint programs: %v", err)
	}
	return coll
}
