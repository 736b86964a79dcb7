package bpf_test

import (
	"context"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/policy"
	"github.com/cellium/cellium/test/privileged"
)

var (
	allowAllIngress = policy.Entry{Key: policy.NewKey(0, policy.Ingress, policy.ProtoAny, 0, 0)}
	allowAllEgress  = policy.Entry{Key: policy.NewKey(0, policy.Egress, policy.ProtoAny, 0, 0)}
)

// TestPrivilegedProgramTraffic attaches the programs to two pods' veths in
// a node namespace and shows with real TCP, UDP and ICMP packets: allow-all
// passes everything; an enforcing ingress passes only what it allows and
// drops the rest with a drop event and a counter; a deny beats an allow;
// replies pass where the reverse direction enforces; an established
// connection survives an unrelated policy update and stops when its allow
// goes; audit mode passes and reports.
func TestPrivilegedProgramTraffic(t *testing.T) {
	privileged.Require(t)
	m, dir := openMaps(t)
	events := newEventReader(t, m)
	var seen []maps.Event

	node := newTestNode(t)
	a := node.addPod(t, "a", netip.MustParseAddr("10.77.0.10"))
	b := node.addPod(t, "b", netip.MustParseAddr("10.77.0.11"))
	const idA, idB identity.NumericIdentity = 1001, 1002
	const epA, epB uint16 = 1, 2
	registerPod(t, m, a, idA, epA)
	registerPod(t, m, b, idB, epB)
	polA, polB := openPolicy(t, dir, epA), openPolicy(t, dir, epB)
	for _, pm := range []*maps.PolicyMap{polA, polB} {
		if err := pm.BatchUpdate([]policy.Entry{allowAllIngress, allowAllEgress}); err != nil {
			t.Fatal(err)
		}
	}
	cfgA := endpointConfig{ID: epA, Identity: idA, IfIndex: uint32(a.res.HostIfIndex), MAC: a.res.PodMAC, IPv4: a.ip}
	cfgB := endpointConfig{ID: epB, Identity: idB, IfIndex: uint32(b.res.HostIfIndex), MAC: b.res.PodMAC, IPv4: b.ip}
	node.attach(t, a, loadEndpoint(t, m, polA, cfgA))
	attB := node.attach(t, b, loadEndpoint(t, m, polB, cfgB))

	a.serveEcho(t, 80)
	b.serveEcho(t, 80)
	b.serveEcho(t, 8080)
	bWeb, bAlt, aWeb := netip.AddrPortFrom(b.ip, 80), netip.AddrPortFrom(b.ip, 8080), netip.AddrPortFrom(a.ip, 80)

	counter := func(reason uint8, d maps.TrafficDir) uint64 {
		t.Helper()
		v, err := m.Metrics.Get(maps.MetricsKey{Reason: reason, Dir: d})
		if err != nil {
			t.Fatal(err)
		}
		return v.Packets
	}
	// refused dials dst from pod from and returns the drop event that
	// stopped it: the dial is cancelled once the event is in.
	refused := func(t *testing.T, from *testPod, dst netip.AddrPort, ep uint16, reason uint8) maps.Event {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		type result struct{ err error }
		done := make(chan result, 1)
		go func() {
			c, err := from.dial(ctx, dst)
			if c != nil {
				c.Close()
			}
			done <- result{err}
		}()
		ev := events.waitFor(t, "drop", &seen, func(e maps.Event) bool {
			return e.Type == maps.EventDrop && e.EndpointID == ep && e.Src == from.ip && e.Dst == dst.Addr() && e.DstPort == dst.Port()
		})
		cancel()
		if r := <-done; r.err == nil {
			t.Errorf("connection to %s succeeded, want it dropped", dst)
		}
		if ev.Reason != reason || ev.Proto != policy.ProtoTCP {
			t.Errorf("drop event %v: reason %d (%s), want %d (%s)", ev, ev.Reason, maps.DropReasonName(ev.Reason), reason, maps.DropReasonName(reason))
		}
		return ev
	}

	t.Run("allow-all passes TCP, UDP and ICMP", func(t *testing.T) {
		fwdIn, fwdOut := counter(maps.ReasonForwarded, maps.DirIngress), counter(maps.ReasonForwarded, maps.DirEgress)
		if err := a.tcpEcho(bWeb); err != nil {
			t.Errorf("tcp a->b: %v", err)
		}
		if err := b.tcpEcho(aWeb); err != nil {
			t.Errorf("tcp b->a: %v", err)
		}
		if err := a.udpEcho(bWeb); err != nil {
			t.Errorf("udp a->b: %v", err)
		}
		if err := privileged.Ping(a.ns, b.ip); err != nil {
			t.Errorf("ping a->b: %v", err)
		}
		if in, out := counter(maps.ReasonForwarded, maps.DirIngress), counter(maps.ReasonForwarded, maps.DirEgress); in <= fwdIn || out <= fwdOut {
			t.Errorf("forwarded counters did not move: ingress %d->%d egress %d->%d", fwdIn, in, fwdOut, out)
		}
		var ct []maps.CTKey
		if err := m.CT4.Iterate(func(k maps.CTKey, _ maps.CTEntry) bool { ct = append(ct, k); return true }); err != nil {
			t.Fatal(err)
		}
		want := maps.CTKey{Src: a.ip, Dst: b.ip, DstPort: 0, Proto: policy.ProtoICMP, Dir: maps.CTEgress}
		found := false
		for _, k := range ct {
			if k.Src == want.Src && k.Dst == want.Dst && k.Proto == want.Proto && k.Dir == want.Dir && k.SrcPort != 0 {
				found = true
			}
		}
		if !found {
			t.Errorf("no egress conntrack entry for the ping with its echo id; have %v", ct)
		}
	})

	// B's ingress allows only identity A on TCP/80; A's ingress allows
	// nothing, so A only gets replies.
	allowAToB80 := policy.Entry{Key: policy.NewKey(idA, policy.Ingress, policy.ProtoTCP, 80, 16)}
	t.Run("enforcing ingress", func(t *testing.T) {
		if err := polB.Update(allowAToB80); err != nil {
			t.Fatal(err)
		}
		for _, pm := range []*maps.PolicyMap{polA, polB} {
			if err := pm.Delete(allowAllIngress.Key); err != nil {
				t.Fatal(err)
			}
		}
		if err := a.tcpEcho(bWeb); err != nil {
			t.Errorf("allowed tcp a->b:80 (its replies enter enforcing A): %v", err)
		}
		drops := counter(maps.DropPolicy, maps.DirIngress)
		refused(t, a, bAlt, epB, maps.DropPolicy)
		if got := counter(maps.DropPolicy, maps.DirIngress); got <= drops {
			t.Errorf("Policy denied ingress counter %d -> %d, want it to grow", drops, got)
		}
		// A new connection the other way meets A's enforcing ingress.
		ev := refused(t, b, aWeb, epA, maps.DropPolicy)
		if ev.SrcIdentity != idB || ev.DstIdentity != idA || ev.Dir != maps.DirIngress {
			t.Errorf("drop event %v: want identities %d -> %d ingress", ev, idB, idA)
		}
		// The verdict of the refused connection's first packet came
		// before its drop.
		if !slices.ContainsFunc(seen, func(e maps.Event) bool {
			return e.Type == maps.EventPolicyVerdict && e.Verdict == maps.VerdictDenied && e.EndpointID == epA &&
				e.Src == b.ip && e.DstPort == 80 && e.Reason == maps.DropPolicy
		}) {
			t.Errorf("no denied policy verdict event for b->a:80; saw %v", seen)
		}
	})

	t.Run("deny beats allow", func(t *testing.T) {
		deny := policy.Entry{Key: policy.NewKey(0, policy.Ingress, policy.ProtoTCP, 80, 16), Deny: true}
		if err := polB.Update(deny); err != nil {
			t.Fatal(err)
		}
		refused(t, a, bWeb, epB, maps.DropPolicyDenyList)
		if err := polB.Delete(deny.Key); err != nil {
			t.Fatal(err)
		}
		if err := a.tcpEcho(bWeb); err != nil {
			t.Errorf("tcp a->b:80 after the deny went: %v", err)
		}
	})

	t.Run("established connection follows policy updates", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := a.dial(ctx, bWeb)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := roundTrip(c, "before"); err != nil {
			t.Fatal(err)
		}
		unrelated := policy.Entry{Key: policy.NewKey(1003, policy.Ingress, policy.ProtoUDP, 53, 16)}
		if err := polB.Update(unrelated); err != nil {
			t.Fatal(err)
		}
		if err := roundTrip(c, "after an unrelated update"); err != nil {
			t.Fatalf("established connection broke on an unrelated policy update: %v", err)
		}
		if err := polB.Delete(allowAToB80.Key); err != nil {
			t.Fatal(err)
		}
		sport := netip.MustParseAddrPort(c.LocalAddr().String()).Port()
		errc := make(chan error, 1)
		go func() { errc <- roundTrip(c, "after its allow went") }()
		ev := events.waitFor(t, "drop", &seen, func(e maps.Event) bool {
			return e.Type == maps.EventDrop && e.EndpointID == epB && e.SrcPort == sport && e.DstPort == 80
		})
		if ev.Reason != maps.DropPolicy {
			t.Errorf("drop of the established connection: %v, want Policy denied", ev)
		}
		// The connection keeps its entry, and so its direction: deleted,
		// b's next packet of it would open an entry b -> a, and a's
		// packets would pass as that entry's replies.
		ctKey := maps.CTKey{Src: a.ip, Dst: b.ip, SrcPort: sport, DstPort: 80, Proto: 6, Dir: maps.CTIngress, Endpoint: epB}
		if _, err := m.CT4.Lookup(ctKey); err != nil {
			t.Errorf("conntrack entry of the denied connection: %v, want it kept", err)
		}
		c.Close() // ends the pending read
		if err := <-errc; err == nil {
			t.Error("the connection still echoes after its allow was removed")
		}
	})

	t.Run("audit mode passes and reports", func(t *testing.T) {
		cfg := cfgB
		cfg.Audit, cfg.Trace = true, true
		attB.replace(t, loadEndpoint(t, m, polB, cfg))
		drops := counter(maps.DropPolicy, maps.DirIngress)
		if err := a.tcpEcho(bAlt); err != nil {
			t.Fatalf("tcp a->b:8080 in audit mode: %v", err)
		}
		ev := events.waitFor(t, "audit verdict", &seen, func(e maps.Event) bool {
			return e.Type == maps.EventPolicyVerdict && e.EndpointID == epB && e.DstPort == 8080
		})
		if ev.Verdict != maps.VerdictAudit || ev.Reason != maps.DropPolicy || ev.Src != a.ip {
			t.Errorf("verdict event %v, want audit (Policy denied) from %s", ev, a.ip)
		}
		events.waitFor(t, "trace", &seen, func(e maps.Event) bool {
			return e.Type == maps.EventTrace && e.EndpointID == epB && e.Reason == maps.TraceToLxc
		})
		if got := counter(maps.DropPolicy, maps.DirIngress); got != drops {
			t.Errorf("audit mode dropped: Policy denied counter %d -> %d", drops, got)
		}
	})
}
