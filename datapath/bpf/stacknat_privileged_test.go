package bpf_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/cellium/cellium/datapath/bpf"
	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/policy"
	"github.com/cellium/cellium/test/privileged"
)

// TestPrivilegedProgramStackNAT: a flow between two local pods that the
// node's stack translated (an nftables DNAT in the node namespace, as
// kube-proxy's for a NodePort or ClusterIP, or a hostPort's) works with
// the same-node redirect on: the request reaches the backend through the
// stack and its cil_to_container, whose conntrack entry records it
// (CT_F_VIA_STACK), so the backend's replies take the stack too, which
// reverses the DNAT, instead of the redirect straight into the client
// (which would show the client the backend's address). TCP and UDP get
// their answers from the virtual address; a direct flow between the
// same pods still takes the redirect (forwarding off) and its entry has
// no such flag; the backend's ingress policy still applies to the
// translated flow.
func TestPrivilegedProgramStackNAT(t *testing.T) {
	privileged.Require(t)
	m, dir := openMaps(t)
	events := newEventReader(t, m)
	var seen []maps.Event

	node := newTestNode(t)
	a := node.addPod(t, "na", netip.MustParseAddr("10.77.0.40"))
	b := node.addPod(t, "nb", netip.MustParseAddr("10.77.0.41"))
	const idA, idB identity.NumericIdentity = 1201, 1202
	const epA, epB uint16 = 21, 22
	registerPod(t, m, a, idA, epA)
	registerPod(t, m, b, idB, epB)
	polA, polB := openPolicy(t, dir, epA), openPolicy(t, dir, epB)
	for _, pm := range []*maps.PolicyMap{polA, polB} {
		if err := pm.BatchUpdate([]policy.Entry{allowAllIngress, allowAllEgress}); err != nil {
			t.Fatal(err)
		}
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
	b.serveEcho(t, 8080)
	backend := netip.AddrPortFrom(b.ip, 8080)
	// The virtual address has no route in the node namespace: only the
	// DNAT makes it reachable.
	vip := netip.AddrPortFrom(netip.MustParseAddr("10.77.9.1"), 80)
	privileged.DNAT(t, node.ns.Path(), fmt.Sprintf("cellium-test-stacknat-%d", os.Getpid()), vip, backend)

	// entry returns B's ingress conntrack entry of a's TCP connection
	// from sport.
	entry := func(t *testing.T, sport uint16) maps.CTEntry {
		t.Helper()
		e, err := m.CT4.Lookup(maps.CTKey{Src: a.ip, Dst: b.ip, SrcPort: sport, DstPort: 8080, Proto: 6, Dir: maps.CTIngress, Endpoint: epB})
		if err != nil {
			t.Fatalf("b's conntrack entry of %s:%d -> %s: %v", a.ip, sport, backend, err)
		}
		return e
	}
	// connect dials dst from a and echoes one message.
	connect := func(t *testing.T, dst netip.AddrPort) (sport uint16) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := a.dial(ctx, dst)
		if err != nil {
			t.Fatalf("tcp a->%s: %v", dst, err)
		}
		defer c.Close()
		if err := roundTrip(c, "through "+dst.String()); err != nil {
			t.Fatalf("tcp a->%s: %v", dst, err)
		}
		if got := c.RemoteAddr().(*net.TCPAddr).AddrPort(); got != dst {
			t.Errorf("peer %s, want %s", got, dst)
		}
		return c.LocalAddr().(*net.TCPAddr).AddrPort().Port()
	}

	t.Run("tcp and udp to the translated address", func(t *testing.T) {
		if err := a.udpEcho(vip); err != nil {
			t.Errorf("udp a->%s: %v", vip, err)
		}
		if err := a.tcpEcho(vip); err != nil {
			t.Errorf("tcp a->%s: %v", vip, err)
		}
		sport := connect(t, vip)
		if e := entry(t, sport); e.Flags&maps.CTFlagViaStack == 0 || e.RemoteID != idA {
			t.Errorf("b's entry of the translated connection %+v: want flag via-stack, remote identity %d", e, idA)
		}
	})

	t.Run("direct flows keep the redirect", func(t *testing.T) {
		node.setForwarding(t, false)
		t.Cleanup(func() { node.setForwarding(t, true) })
		sport := connect(t, backend)
		if e := entry(t, sport); e.Flags&maps.CTFlagViaStack != 0 {
			t.Errorf("b's entry of a direct connection %+v: flag via-stack set", e)
		}
		if err := a.udpEcho(backend); err != nil {
			t.Errorf("udp a->%s with forwarding off: %v", backend, err)
		}
	})

	t.Run("backend ingress policy applies", func(t *testing.T) {
		deny := policy.Entry{Key: policy.NewKey(idA, policy.Ingress, policy.ProtoAny, 0, 0), Deny: true}
		if err := polB.Update(deny); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := polB.Delete(deny.Key); err != nil {
				t.Error(err)
			}
		})
		for _, proto := range []uint8{6, 17} {
			errc := make(chan error, 1)
			go func() {
				if proto == 6 {
					errc <- a.tcpEcho(vip)
				} else {
					errc <- a.udpEcho(vip)
				}
			}()
			ev := events.waitFor(t, "drop", &seen, func(e maps.Event) bool {
				return e.Type == maps.EventDrop && e.EndpointID == epB && e.Proto == proto && e.Src == a.ip && e.Dst == b.ip && e.DstPort == 8080
			})
			if ev.Reason != maps.DropPolicyDenyList || ev.Dir != maps.DirIngress {
				t.Errorf("drop event %v: want endpoint %d, Policy denied by denylist, ingress", ev, epB)
			}
			if err := <-errc; err == nil {
				t.Errorf("protocol %d a->%s passed b's deny", proto, vip)
			}
		}
	})
}
