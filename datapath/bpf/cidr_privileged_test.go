package bpf_test

import (
	"net/netip"
	"testing"

	"github.com/cellium/cellium/datapath/bpf"
	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/policy"
	"github.com/cellium/cellium/test/privileged"
)

// TestPrivilegedProgramCIDROnPodAddress: a pod's address carries, beside
// its endpoint identity, the identity of the policy CIDR that holds it
// (an ipBlock naming a pod, as Kubernetes' Netpol conformance specs do).
// An egress allow on the CIDR identity lets a connection to the pod
// through although no rule names the pod's identity; without the CIDR
// identity in the entry it is dropped; a deny on the CIDR identity drops
// even where the pod's identity is allowed; ingress from a same-node pod
// (whose identity comes without the ipcache) is allowed on the CIDR too.
func TestPrivilegedProgramCIDROnPodAddress(t *testing.T) {
	privileged.Require(t)
	m, dir := openMaps(t)
	self, pod := netip.MustParseAddr("10.7.2.10"), netip.MustParseAddr("10.7.2.11")
	const podID, cidrID, otherCIDR = 1001, 1<<24 | 7, 1<<24 | 8
	prefix := netip.PrefixFrom(pod, 32)
	pm := openPolicy(t, dir, 9)
	coll := loadEndpoint(t, m, pm, endpointConfig{ID: 9, Identity: 1000, IfIndex: 3})
	from := coll.Programs[bpf.LxcProgCilFromContainer]
	setIPCache := func(cidr uint32) {
		t.Helper()
		if err := m.IPCache.Update(prefix, maps.IPCacheEntry{Identity: podID, CIDRIdentity: identity.NumericIdentity(cidr)}); err != nil {
			t.Fatal(err)
		}
		got, err := m.IPCache.Lookup(prefix)
		if err != nil || uint32(got.CIDRIdentity) != cidr {
			t.Fatalf("ipcache round trip: %+v, %v; want CIDR identity %d", got, err, cidr)
		}
	}
	setPolicy := func(entries ...policy.Entry) {
		t.Helper()
		clearCT(t, m)
		var old []policy.Key
		if err := pm.Iterate(func(e policy.Entry) bool { old = append(old, e.Key); return true }); err != nil {
			t.Fatal(err)
		}
		for _, k := range old {
			if err := pm.Delete(k); err != nil {
				t.Fatal(err)
			}
		}
		if err := pm.BatchUpdate(entries); err != nil {
			t.Fatal(err)
		}
	}
	for i, c := range []struct {
		what    string
		cidr    uint32
		entries []policy.Entry
		want    uint32
	}{
		{"allow on the CIDR holding the pod", cidrID, []policy.Entry{{Key: policy.NewKey(cidrID, policy.Egress, policy.ProtoTCP, 80, 16)}}, tcActOK},
		{"the same rule, the entry without CIDR identity", 0, []policy.Entry{{Key: policy.NewKey(cidrID, policy.Egress, policy.ProtoTCP, 80, 16)}}, tcActShot},
		{"allow on another CIDR", otherCIDR, []policy.Entry{{Key: policy.NewKey(cidrID, policy.Egress, policy.ProtoTCP, 80, 16)}}, tcActShot},
		{"deny on the CIDR beats allow on the pod", cidrID, []policy.Entry{
			{Key: policy.NewKey(podID, policy.Egress, policy.ProtoTCP, 80, 16)},
			{Key: policy.NewKey(cidrID, policy.Egress, policy.ProtoTCP, 80, 16), Deny: true},
		}, tcActShot},
		{"allow on the pod, nothing on the CIDR", cidrID, []policy.Entry{{Key: policy.NewKey(podID, policy.Egress, policy.ProtoTCP, 80, 16)}}, tcActOK},
	} {
		setIPCache(c.cidr)
		setPolicy(c.entries...)
		if got := run(t, from, packet(self, pod, 6, uint16(41000+i), 80, tcpSYN)); got != c.want {
			t.Errorf("%s: verdict %d, want %d", c.what, got, c.want)
		}
	}
}
