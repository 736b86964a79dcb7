package bpf_test

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/cellium/cellium/datapath/bpf"
	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/policy"
	"github.com/cellium/cellium/test/privileged"
)

// randomPolicy returns sorted, unique entries in both directions over a
// few identities, protocols and port prefixes, with some denies.
func randomPolicy(r *rand.Rand, n int) []policy.Entry {
	ids := []identity.NumericIdentity{0, 1001, 1002, 1003, identity.ReservedIdentityWorld}
	protos := []uint8{policy.ProtoAny, policy.ProtoTCP, policy.ProtoTCP, policy.ProtoUDP, policy.ProtoICMP}
	ports := []uint16{0, 53, 80, 443, 1024, 8080}
	plens := []uint8{0, 6, 8, 12, 16, 16}
	byKey := map[policy.Key]policy.Entry{}
	for range n {
		k := policy.NewKey(ids[r.IntN(len(ids))], policy.Direction(r.IntN(2)), protos[r.IntN(len(protos))],
			ports[r.IntN(len(ports))], plens[r.IntN(len(plens))])
		byKey[k] = policy.Entry{Key: k, Deny: r.IntN(10) < 3}
	}
	out := make([]policy.Entry, 0, len(byKey))
	for _, e := range byKey {
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b policy.Entry) int { return a.Key.Compare(b.Key) })
	return out
}

func directionPolicy(entries []policy.Entry, d policy.Direction) *policy.DirectionPolicy {
	dp := &policy.DirectionPolicy{Enforcing: true}
	for _, e := range entries {
		if e.Direction == d {
			dp.Entries = append(dp.Entries, e)
		}
	}
	return dp
}

// TestPrivilegedProgramPolicyMatchesDecide runs both programs on crafted
// packets (BPF_PROG_TEST_RUN) against random policy maps and checks every
// verdict, drop reason and policy verdict event against
// statedb/policy DirectionPolicy.Decide on the same entries.
func TestPrivilegedProgramPolicyMatchesDecide(t *testing.T) {
	privileged.Require(t)
	m, dir := openMaps(t)
	events := newEventReader(t, m)
	self := netip.MustParseAddr("10.7.0.10")
	remotes := map[netip.Addr]identity.NumericIdentity{
		netip.MustParseAddr("10.7.0.11"): 1001,
		netip.MustParseAddr("10.7.0.12"): 1002,
		netip.MustParseAddr("10.7.1.13"): 1003,                           // via the /24 below
		netip.MustParseAddr("192.0.2.1"): identity.ReservedIdentityWorld, // not in the ipcache
	}
	for p, id := range map[string]identity.NumericIdentity{"10.7.0.10/32": 1000, "10.7.0.11/32": 1001, "10.7.0.12/32": 1002, "10.7.1.0/24": 1003} {
		if err := m.IPCache.Update(netip.MustParsePrefix(p), maps.IPCacheEntry{Identity: id}); err != nil {
			t.Fatal(err)
		}
	}
	remoteAddrs := make([]netip.Addr, 0, len(remotes))
	for a := range remotes {
		remoteAddrs = append(remoteAddrs, a)
	}
	slices.SortFunc(remoteAddrs, netip.Addr.Compare)

	r := rand.New(rand.NewPCG(8, 2026))
	sport := uint16(40000)
	checked, denied := 0, 0
	for round := range 12 {
		epID := uint16(100 + round)
		entries := randomPolicy(r, 4+r.IntN(20))
		pm := openPolicy(t, dir, epID)
		if err := pm.BatchUpdate(entries); err != nil {
			t.Fatal(err)
		}
		audit := round%4 == 3
		coll := loadEndpoint(t, m, pm, endpointConfig{ID: epID, Identity: 1000, IfIndex: 1, IPv4: self, Audit: audit})
		for range 60 {
			remote := remoteAddrs[r.IntN(len(remoteAddrs))]
			proto := []uint8{6, 6, 17, 1, 132}[r.IntN(5)]
			dport := []uint16{53, 80, 81, 443, 1030, 2047, 8080, 9999}[r.IntN(8)]
			dir := policy.Direction(r.IntN(2))
			sport++
			src, dst, prog := remote, self, coll.Programs[bpf.LxcProgCilToContainer]
			if dir == policy.Egress {
				src, dst, prog = self, remote, coll.Programs[bpf.LxcProgCilFromContainer]
			}
			policyPort := dport
			switch proto {
			case 1:
				policyPort = 8 // ICMP is matched on its type: packet sends echo requests
			case 132:
				policyPort = 0 // unparsed protocols are matched with port 0
			}
			allowed, decided, matched := directionPolicy(entries, dir).Decide(remotes[remote], proto, policyPort)
			wantReason := uint8(0)
			if !allowed {
				wantReason = maps.DropPolicy
				if matched && decided.Deny {
					wantReason = maps.DropPolicyDenyList
				}
			}
			what := fmt.Sprintf("round %d %s %s -> %s proto %d dport %d (entries %v)", round, dir, src, dst, proto, dport, entries)

			// Unparsed protocols have no ports: an earlier packet the
			// other way would make this one its reply.
			clearCT(t, m)
			ret := run(t, prog, packet(src, dst, proto, sport, dport, 0x02))
			evs := events.drain(t)
			checked++
			wantRet := uint32(tcActOK)
			if !allowed && !audit {
				wantRet = tcActShot
				denied++
			}
			if ret != wantRet {
				t.Fatalf("%s: program returned %d, Decide says allowed=%v (%v); want %d", what, ret, allowed, decided, wantRet)
			}
			var drops, verdicts []maps.Event
			for _, e := range evs {
				switch e.Type {
				case maps.EventDrop:
					drops = append(drops, e)
				case maps.EventPolicyVerdict:
					verdicts = append(verdicts, e)
				}
			}
			switch {
			case !allowed && !audit:
				if len(drops) != 1 || drops[0].Reason != wantReason || len(verdicts) != 1 || verdicts[0].Verdict != maps.VerdictDenied {
					t.Fatalf("%s: events %v; want a denied verdict and a drop with reason %d", what, evs, wantReason)
				}
			case !allowed && audit:
				if len(drops) != 0 || len(verdicts) != 1 || verdicts[0].Verdict != maps.VerdictAudit || verdicts[0].Reason != wantReason {
					t.Fatalf("%s: events %v; want one audit verdict with reason %d", what, evs, wantReason)
				}
			default:
				allowAll := decided.Identity == 0 && decided.Proto == policy.ProtoAny
				if len(drops) != 0 || (allowAll && len(verdicts) != 0) || (!allowAll && (len(verdicts) != 1 || verdicts[0].Verdict != maps.VerdictAllowed)) {
					t.Fatalf("%s: events %v for an allowed packet (decided by %v)", what, evs, decided)
				}
			}
			for _, e := range evs {
				wantDir := maps.DirIngress
				if dir == policy.Egress {
					wantDir = maps.DirEgress
				}
				if e.EndpointID != epID || e.IfIndex != 1 || e.Dir != wantDir || e.Src != src || e.Dst != dst || e.Proto != proto {
					t.Fatalf("%s: event %+v does not describe the packet", what, e)
				}
				srcID, dstID := remotes[remote], identity.NumericIdentity(1000)
				if dir == policy.Egress {
					srcID, dstID = dstID, srcID
				}
				if e.SrcIdentity != srcID || e.DstIdentity != dstID {
					t.Fatalf("%s: event identities %d -> %d, want %d -> %d", what, e.SrcIdentity, e.DstIdentity, srcID, dstID)
				}
			}
		}
	}
	t.Logf("checked %d packets against Decide, %d dropped", checked, denied)
	if denied == 0 || denied == checked {
		t.Errorf("random policies gave %d drops in %d packets: the test exercises one verdict only", denied, checked)
	}
}
