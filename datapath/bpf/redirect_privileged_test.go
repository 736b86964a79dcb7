package bpf_test

import (
	"context"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/cellium/cellium/datapath/bpf"
	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/policy"
	"github.com/cellium/cellium/test/privileged"
)

// setForwarding turns IPv4 forwarding of the node namespace on or off.
func (node *testNode) setForwarding(tb testing.TB, on bool) {
	tb.Helper()
	v := "0\n"
	if on {
		v = "1\n"
	}
	if err := node.ns.Do(func(ns.NetNS) error {
		return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte(v), 0)
	}); err != nil {
		tb.Fatal(err)
	}
}

// TestPrivilegedProgramRedirect shows the same-node redirect with real
// packets: with both pods' cil_lxc_policy in cellium_policy_progs,
// traffic between them flows with forwarding off in the node (so it
// cannot have taken the stack), one routed hop as seen by TTL; the
// destination's ingress policy still drops what it does not allow and a
// deny stops an established connection, with drop events from the
// destination endpoint; the source's egress policy drops first, with its
// own drop event; the destination's policy sees the source endpoint's
// identity, not the ipcache's. With the destination's slot empty, packets
// take the stack again and its cil_to_container enforces; so they do when
// the slot holds another endpoint's program.
func TestPrivilegedProgramRedirect(t *testing.T) {
	privileged.Require(t)
	m, dir := openMaps(t)
	events := newEventReader(t, m)
	var seen []maps.Event

	node := newTestNode(t)
	a := node.addPod(t, "ra", netip.MustParseAddr("10.77.0.20"))
	b := node.addPod(t, "rb", netip.MustParseAddr("10.77.0.21"))
	const idA, idB identity.NumericIdentity = 1101, 1102
	const epA, epB uint16 = 11, 12
	registerPod(t, m, a, idA, epA)
	registerPod(t, m, b, idB, epB)
	// A's egress enforces: B on TCP 80 and 8080 and ICMP. B's ingress
	// enforces: A on TCP 80 and ICMP. Replies pass by conntrack.
	polA, polB := openPolicy(t, dir, epA), openPolicy(t, dir, epB)
	if err := polA.BatchUpdate([]policy.Entry{
		allowAllIngress,
		{Key: policy.NewKey(idB, policy.Egress, policy.ProtoTCP, 80, 16)},
		{Key: policy.NewKey(idB, policy.Egress, policy.ProtoTCP, 8080, 16)},
		{Key: policy.NewKey(idB, policy.Egress, policy.ProtoICMP, 0, 0)},
	}); err != nil {
		t.Fatal(err)
	}
	if err := polB.BatchUpdate([]policy.Entry{
		allowAllEgress,
		{Key: policy.NewKey(idA, policy.Ingress, policy.ProtoTCP, 80, 16)},
		{Key: policy.NewKey(idA, policy.Ingress, policy.ProtoICMP, 0, 0)},
	}); err != nil {
		t.Fatal(err)
	}
	collA := loadEndpoint(t, m, polA, endpointConfig{ID: epA, Identity: idA, IfIndex: uint32(a.res.HostIfIndex), MAC: a.res.PodMAC, IPv4: a.ip})
	collB := loadEndpoint(t, m, polB, endpointConfig{ID: epB, Identity: idB, IfIndex: uint32(b.res.HostIfIndex), MAC: b.res.PodMAC, IPv4: b.ip})
	node.attach(t, a, collA)
	node.attach(t, b, collB)
	for ep, coll := range map[uint16]*ebpf.Collection{epA: collA, epB: collB} {
		if err := m.PolicyProgs.Set(ep, coll.Programs[bpf.LxcProgCilLxcPolicy]); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, ep := range []uint16{epA, epB} {
			if err := m.PolicyProgs.Delete(ep); err != nil {
				t.Error(err)
			}
		}
	})
	b.serveEcho(t, 80)
	b.serveEcho(t, 8080)
	bWeb, bAlt := netip.AddrPortFrom(b.ip, 80), netip.AddrPortFrom(b.ip, 8080)

	// dropped dials dst from a and returns the drop event that stopped
	// the connection; the dial is cancelled once the event is in.
	dropped := func(t *testing.T, dst netip.AddrPort, ep uint16, reason uint8, d maps.TrafficDir) {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			c, err := a.dial(ctx, dst)
			if c != nil {
				c.Close()
			}
			done <- err
		}()
		ev := events.waitFor(t, "drop", &seen, func(e maps.Event) bool {
			return e.Type == maps.EventDrop && e.EndpointID == ep && e.Src == a.ip && e.Dst == dst.Addr() && e.DstPort == dst.Port()
		})
		cancel()
		if err := <-done; err == nil {
			t.Errorf("connection to %s succeeded, want it dropped", dst)
		}
		if ev.Reason != reason || ev.Dir != d {
			t.Errorf("drop event %v: want endpoint %d, reason %d (%s), dir %v", ev, ep, reason, maps.DropReasonName(reason), d)
		}
	}

	t.Run("redirect with forwarding off", func(t *testing.T) {
		node.setForwarding(t, false)
		t.Cleanup(func() { node.setForwarding(t, true) })
		if err := a.tcpEcho(bWeb); err != nil {
			t.Errorf("tcp a->b:80 with forwarding off (needs the redirect both ways): %v", err)
		}
		ttl, err := privileged.PingTTL(a.ns, b.ip)
		if err != nil {
			t.Errorf("ping a->b with forwarding off: %v", err)
		} else if ttl != 63 {
			t.Errorf("echo reply TTL %d, want 63 (one routed hop)", ttl)
		}
	})

	t.Run("destination ingress still enforced", func(t *testing.T) {
		node.setForwarding(t, false)
		t.Cleanup(func() { node.setForwarding(t, true) })
		// A's egress allows 8080, B's ingress does not: B's program,
		// reached by the tail call, drops it.
		dropped(t, bAlt, epB, maps.DropPolicy, maps.DirIngress)

		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		c, err := a.dial(ctx, bWeb)
		if err != nil {
			t.Fatalf("dial a->b:80: %v", err)
		}
		defer c.Close()
		if err := roundTrip(c, "before"); err != nil {
			t.Fatalf("established a->b:80: %v", err)
		}
		deny := policy.Entry{Key: policy.NewKey(0, policy.Ingress, policy.ProtoTCP, 80, 16), Deny: true}
		if err := polB.Update(deny); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := polB.Delete(deny.Key); err != nil {
				t.Error(err)
			}
		})
		go func() { _ = roundTrip(c, "after") }()
		ev := events.waitFor(t, "drop", &seen, func(e maps.Event) bool {
			return e.Type == maps.EventDrop && e.EndpointID == epB && e.Src == a.ip && e.Dst == b.ip && e.DstPort == 80
		})
		c.Close()
		if ev.Reason != maps.DropPolicyDenyList || ev.Dir != maps.DirIngress {
			t.Errorf("drop event %v: want endpoint %d, Policy denied by denylist, ingress", ev, epB)
		}
	})

	t.Run("source egress enforced before the redirect", func(t *testing.T) {
		// A deny for any identity beats A's allow for B on 8080.
		deny := policy.Entry{Key: policy.NewKey(0, policy.Egress, policy.ProtoTCP, 8080, 16), Deny: true}
		if err := polA.Update(deny); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := polA.Delete(deny.Key); err != nil {
				t.Error(err)
			}
		})
		dropped(t, bAlt, epA, maps.DropPolicyDenyList, maps.DirEgress)
	})

	t.Run("destination sees the source endpoint's identity", func(t *testing.T) {
		// The ipcache now maps A's address to another identity; the
		// redirect still hands B's policy A's own identity.
		if err := m.IPCache.Update(netip.PrefixFrom(a.ip, 32), maps.IPCacheEntry{Identity: 9999}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := m.IPCache.Update(netip.PrefixFrom(a.ip, 32), maps.IPCacheEntry{Identity: idA}); err != nil {
				t.Error(err)
			}
		})
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := a.dial(ctx, bWeb)
		if err != nil {
			t.Fatalf("tcp a->b:80 allowed for identity %d: %v", idA, err)
		}
		defer c.Close()
		if err := roundTrip(c, "identity"); err != nil {
			t.Fatal(err)
		}
		sport := c.LocalAddr().(*net.TCPAddr).AddrPort().Port()
		ev := events.waitFor(t, "policy verdict", &seen, func(e maps.Event) bool {
			return e.Type == maps.EventPolicyVerdict && e.EndpointID == epB && e.Src == a.ip && e.SrcPort == sport
		})
		if ev.SrcIdentity != idA || ev.Verdict != maps.VerdictAllowed {
			t.Errorf("verdict event %v: want allowed from identity %d", ev, idA)
		}
	})

	t.Run("a stale slot takes the stack", func(t *testing.T) {
		// B's slot holds A's program (an endpoint ID reused, a slot not
		// cleaned up): it is not B's, so the packet takes the stack and
		// B's cil_to_container, not A's policy.
		if err := m.PolicyProgs.Set(epB, collA.Programs[bpf.LxcProgCilLxcPolicy]); err != nil {
			t.Fatal(err)
		}
		if err := a.tcpEcho(bWeb); err != nil {
			t.Errorf("tcp a->b:80 through the stack: %v", err)
		}
		dropped(t, bAlt, epB, maps.DropPolicy, maps.DirIngress)
	})

	t.Run("empty slot takes the stack", func(t *testing.T) {
		if err := m.PolicyProgs.Delete(epB); err != nil {
			t.Fatal(err)
		}
		if has, err := m.PolicyProgs.Has(epB); err != nil || has {
			t.Fatalf("slot %d after Delete: has %v, err %v", epB, has, err)
		}
		if err := a.tcpEcho(bWeb); err != nil {
			t.Errorf("tcp a->b:80 through the stack: %v", err)
		}
		// cil_to_container on B's veth enforces B's ingress again.
		dropped(t, bAlt, epB, maps.DropPolicy, maps.DirIngress)
	})
}
