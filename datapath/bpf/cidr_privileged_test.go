package bpf_test

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

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
	coll := loadEndpoint(t, m, pm, endpointConfig{ID: 9, Identity: 1000, IfIndex: 3, IPv4: self})
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
	setPolicy := func(entries ...policy.Entry) { t.Helper(); replacePolicy(t, m, pm, entries...) }
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

// skbCB is the head of struct __sk_buff up to cb[], the part
// BPF_PROG_TEST_RUN lets a test set: cb[0] carries the source endpoint's
// identity into cil_lxc_policy, as the same-node redirect's tail call
// does.
type skbCB struct {
	Len, PktType, Mark, QueueMapping, Protocol, VlanPresent, VlanTCI, VlanProto uint32
	Priority, IngressIfindex, Ifindex, TCIndex                                  uint32
	CB                                                                          [5]uint32
}

// tcActRedirect is cil_lxc_policy's verdict for a packet it passes
// (bpf_redirect_peer).
const tcActRedirect = 7

// TestPrivilegedProgramCIDRDenyLocalSource: ingress from a pod of the
// same node through the same-node redirect (cil_lxc_policy, the source's
// identity handed over in skb->cb, not looked up in the ipcache): a deny
// on the CIDR identity its address carries wins over an allow of its
// identity, as it does through the stack (cil_to_container); an allow on
// the CIDR identity lets in what its identity alone may not; an
// established connection the identity allows keeps passing.
func TestPrivilegedProgramCIDRDenyLocalSource(t *testing.T) {
	privileged.Require(t)
	m, dir := openMaps(t)
	self, pod := netip.MustParseAddr("10.7.3.10"), netip.MustParseAddr("10.7.3.12")
	const selfID, podID, cidrID = 1000, 1003, 1<<24 | 9
	const ep, ifindex = 9, 3
	if err := m.Endpoints.Update(self, maps.EndpointInfo{IfIndex: ifindex, ID: ep, Identity: selfID}); err != nil {
		t.Fatal(err)
	}
	if err := m.IPCache.Update(netip.PrefixFrom(pod, 32), maps.IPCacheEntry{Identity: podID, CIDRIdentity: cidrID}); err != nil {
		t.Fatal(err)
	}
	pm := openPolicy(t, dir, ep)
	coll := loadEndpoint(t, m, pm, endpointConfig{ID: ep, Identity: selfID, IfIndex: ifindex, IPv4: self})
	lxcPolicy, to := coll.Programs[bpf.LxcProgCilLxcPolicy], coll.Programs[bpf.LxcProgCilToContainer]
	// viaRedirect runs cil_lxc_policy as the source pod's tail call does.
	viaRedirect := func(pkt []byte) uint32 {
		t.Helper()
		ret, err := lxcPolicy.Run(&ebpf.RunOptions{Data: pkt, Context: skbCB{CB: [5]uint32{podID}}})
		if err != nil {
			t.Fatal(err)
		}
		return ret
	}
	setPolicy := func(entries ...policy.Entry) { t.Helper(); replacePolicy(t, m, pm, entries...) }
	allowPod := policy.Entry{Key: policy.NewKey(podID, policy.Ingress, policy.ProtoTCP, 80, 16)}
	denyCIDR := policy.Entry{Key: policy.NewKey(cidrID, policy.Ingress, policy.ProtoTCP, 80, 16), Deny: true}
	allowCIDR := policy.Entry{Key: policy.NewKey(cidrID, policy.Ingress, policy.ProtoTCP, 80, 16)}

	setPolicy(allowPod, denyCIDR)
	syn := packet(pod, self, 6, 42000, 80, tcpSYN)
	if got := run(t, to, syn); got != tcActShot {
		t.Errorf("through the stack: deny on the CIDR, allow on the pod: verdict %d, want %d", got, tcActShot)
	}
	if got := viaRedirect(syn); got != tcActShot {
		t.Errorf("through the redirect: deny on the CIDR, allow on the pod: verdict %d, want %d (dropped)", got, tcActShot)
	}

	setPolicy(allowCIDR)
	if got := viaRedirect(packet(pod, self, 6, 42001, 80, tcpSYN)); got != tcActRedirect {
		t.Errorf("through the redirect: allow on the CIDR only: verdict %d, want %d (redirected)", got, tcActRedirect)
	}

	setPolicy(allowPod)
	if got := viaRedirect(packet(pod, self, 6, 42002, 80, tcpSYN)); got != tcActRedirect {
		t.Errorf("through the redirect: allow on the pod, nothing on the CIDR: verdict %d, want %d", got, tcActRedirect)
	}
	if got := viaRedirect(packet(pod, self, 6, 42002, 80, tcpACK)); got != tcActRedirect {
		t.Errorf("through the redirect: established, allowed: verdict %d, want %d", got, tcActRedirect)
	}
}

// replacePolicy empties the conntrack map and makes entries the whole of
// pm.
func replacePolicy(tb testing.TB, m *maps.Maps, pm *maps.PolicyMap, entries ...policy.Entry) {
	tb.Helper()
	clearCT(tb, m)
	setPolicy(tb, pm, entries...)
}

// setPolicy makes entries the whole of pm, leaving conntrack alone.
func setPolicy(tb testing.TB, pm *maps.PolicyMap, entries ...policy.Entry) {
	tb.Helper()
	var old []policy.Key
	if err := pm.Iterate(func(e policy.Entry) bool { old = append(old, e.Key); return true }); err != nil {
		tb.Fatal(err)
	}
	for _, k := range old {
		if err := pm.Delete(k); err != nil {
			tb.Fatal(err)
		}
	}
	if len(entries) == 0 {
		return
	}
	if err := pm.BatchUpdate(entries); err != nil {
		tb.Fatal(err)
	}
}
