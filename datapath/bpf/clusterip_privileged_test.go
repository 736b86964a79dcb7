package bpf_test

import (
	"net/netip"
	"testing"

	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/policy"
	"github.com/cellium/cellium/test/privileged"
)

// TestPrivilegedAttackClusterIPUntranslated: a pod with NET_RAW sends to a
// ClusterIP from a raw socket (or a ping socket, or a tun device's
// stack), which the socket load balancer's cgroup hooks never see. Before
// the guard the packet passed as traffic to world, and kube-proxy, had it
// been there, would have taken it to a backend the pod's egress policy
// may forbid. With the address flagged as a Service frontend in the
// ipcache (what the agent does while the socket LB is on), it drops with
// 174 before conntrack and policy, counted and reported; an unflagged
// world address still meets the policy, and replies are not affected.
func TestPrivilegedAttackClusterIPUntranslated(t *testing.T) {
	privileged.Require(t)
	b := newAttackBed(t)
	vip := netip.MustParseAddr("10.96.0.10")
	if err := b.m.IPCache.Update(netip.PrefixFrom(vip, 32),
		maps.IPCacheEntry{Identity: identity.ReservedIdentityWorld, Flags: maps.IPCacheFlagService}); err != nil {
		t.Fatal(err)
	}
	before := b.metric(t, maps.DropIsClusterIP)

	// A's egress allows anything: only the guard stops these.
	b.expectDrop(t, "A's raw ICMP echo to the ClusterIP", b.from(t, epA, packet(b.a, vip, 1, 7, 0, 0)), epA, maps.DropIsClusterIP)
	b.expectDrop(t, "A's raw UDP to the ClusterIP", b.from(t, epA, packet(b.a, vip, 17, 40000, 53, 0)), epA, maps.DropIsClusterIP)
	b.expectDrop(t, "A's TCP SYN to the ClusterIP", b.from(t, epA, packet(b.a, vip, 6, 40001, 80, tcpSYN)), epA, maps.DropIsClusterIP)
	b.expectDrop(t, "A's TCP SYN to a port the Service does not have", b.from(t, epA, packet(b.a, vip, 6, 40002, 9, tcpSYN)), epA, maps.DropIsClusterIP)
	b.expectDrop(t, "A's raw IP (protocol 253) to the ClusterIP", b.from(t, epA, packet(b.a, vip, 253, 0, 0, 0)), epA, maps.DropIsClusterIP)
	// Z's egress denies everything: the guard's reason comes first.
	b.expectDrop(t, "Z's SYN to the ClusterIP", b.from(t, epZ, packet(b.z, vip, 6, 40003, 80, tcpSYN)), epZ, maps.DropIsClusterIP)
	if got := b.metric(t, maps.DropIsClusterIP) - before; got != 6 {
		t.Errorf("cellium_metrics counts %d drops with 174 in egress, want 6", got)
	}
	for k := range b.ctEntries(t) {
		if k.Dst == vip {
			t.Errorf("a dropped packet made conntrack entry %+v", k)
		}
	}

	// The same to an unflagged world address: per policy, as before.
	b.expectPass(t, "A's raw ICMP echo to R", b.from(t, epA, packet(b.a, b.r, 1, 7, 0, 0)))
	b.expectPass(t, "A's raw UDP to R", b.from(t, epA, packet(b.a, b.r, 17, 40000, 53, 0)))
	b.expectPass(t, "A's TCP SYN to R", b.from(t, epA, packet(b.a, b.r, 6, 40001, 80, tcpSYN)))
	b.expectDrop(t, "Z's SYN to R", b.from(t, epZ, packet(b.z, b.r, 6, 40003, 80, tcpSYN)), epZ, maps.DropPolicy)

	// A packet from the address into a pod is the ingress policy's, and
	// the pod's reply to it passes as a reply: the guard is on what the
	// pod opens, after the reply fast path.
	setPolicy(t, b.pol[epA], allowAllEgress,
		policy.Entry{Key: policy.NewKey(identity.ReservedIdentityWorld, policy.Ingress, policy.ProtoTCP, 8080, 16)})
	b.expectPass(t, "a SYN from the ClusterIP's address into A", b.to(t, epA, packet(vip, b.a, 6, 33000, 8080, tcpSYN)))
	b.expectPass(t, "A's SYN-ACK to it (a reply)", b.from(t, epA, packet(b.a, vip, 6, 8080, 33000, tcpSYN|tcpACK)))
	b.expectDrop(t, "Z's SYN from the ClusterIP's address (Z accepts nothing)", b.to(t, epZ, packet(vip, b.z, 6, 33000, 8080, tcpSYN)), epZ, maps.DropPolicy)

	// Unflagged (the socket LB off), the address is world again.
	if err := b.m.IPCache.Update(netip.PrefixFrom(vip, 32), maps.IPCacheEntry{Identity: identity.ReservedIdentityWorld}); err != nil {
		t.Fatal(err)
	}
	b.expectPass(t, "A's raw UDP to the address unflagged", b.from(t, epA, packet(b.a, vip, 17, 40004, 53, 0)))
}

// metric returns the packets counted in egress with reason.
func (b *attackBed) metric(t *testing.T, reason uint8) uint64 {
	t.Helper()
	all, err := b.m.Metrics.Read()
	if err != nil {
		t.Fatal(err)
	}
	return all[maps.MetricsKey{Reason: reason, Dir: maps.DirEgress}].Packets
}
