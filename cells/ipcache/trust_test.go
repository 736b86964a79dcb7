package ipcache

import (
	"maps"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/cilium/statedb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/ipcache"
	"github.com/cellium/cellium/statedb/nodes"
)

// The tests of this file are attacks: a writer of CiliumEndpoints tries to
// give a remote address an identity it has no right to. Each ends with the
// honest CEP's row (default/web: identity 2000 for 10.2.0.9 on node n2) in
// place, which proves the deriver has consumed the attacker's objects too.

// cid is a CiliumIdentity of namespace ns (none: no namespace label).
func cid(id int64, ns string) *ciliumv2.CiliumIdentity {
	c := &ciliumv2.CiliumIdentity{ObjectMeta: metav1.ObjectMeta{Name: strconv.FormatInt(id, 10)},
		SecurityLabels: map[string]string{"k8s:app": "x"}}
	if ns != "" {
		c.SecurityLabels["k8s:io.kubernetes.pod.namespace"] = ns
	}
	return c
}

// trustedCluster fills the tables with this node n1 (192.168.0.1, pods
// 10.1.0.0/24), node n2 (192.168.0.2, pods 10.2.0.0/24), identities 2000
// and 2001 (namespace default) and 3000 (kube-system), and the honest CEP
// default/web.
func trustedCluster(t *testing.T) (rw, *Deriver) {
	t.Helper()
	r := newTables(t)
	d := newDeriver(t, r)
	r.write(func(w statedb.WriteTxn) {
		_, _, _ = r.local.Insert(w, &nodes.LocalNode{Name: "n1", InternalIP: addr("192.168.0.1"), RouterIP: addr("10.1.0.1"),
			PodCIDRs: []netip.Prefix{pfx("10.1.0.0/24")}})
		_, _, _ = r.nodes.Insert(w, &nodes.Node{Name: "n1", Local: true, PodCIDRs: []netip.Prefix{pfx("10.1.0.0/24")},
			Addresses: []nodes.Address{{Type: nodes.AddressInternalIP, IP: addr("192.168.0.1")}}})
		_, _, _ = r.nodes.Insert(w, &nodes.Node{Name: "n2", PodCIDRs: []netip.Prefix{pfx("10.2.0.0/24")},
			Addresses: []nodes.Address{{Type: nodes.AddressInternalIP, IP: addr("192.168.0.2")},
				{Type: nodes.AddressCiliumInternalIP, IP: addr("10.2.0.1")}}})
		for _, c := range []*ciliumv2.CiliumIdentity{cid(2000, "default"), cid(2001, "default"), cid(3000, "kube-system")} {
			_, _, _ = r.ids.Insert(w, c)
		}
		_, _, _ = r.ceps.Insert(w, cep("default", "web", "192.168.0.2", 2000, "10.2.0.9"))
	})
	d.mustStep(t)
	wantRow(t, r, "10.2.0.9/32", 2000, "cep default/web")
	return r, d
}

// wantRow fails unless prefix p's row has identity id from owner.
func wantRow(t *testing.T, r rw, p string, id identity.NumericIdentity, owner string) {
	t.Helper()
	e, _, ok := r.IPCache.Get(r.DB.ReadTxn(), ipcache.PrefixIndex.Query(pfx(p)))
	if !ok {
		t.Fatalf("%s: no row, want identity %d from %s", p, id, owner)
	}
	if e.Identity != id || e.Owner != owner {
		t.Fatalf("%s: identity %d from %q, want %d from %q", p, e.Identity, e.Owner, id, owner)
	}
}

// wantNoRow fails if prefix p has a row.
func wantNoRow(t *testing.T, r rw, p string) {
	t.Helper()
	if e, _, ok := r.IPCache.Get(r.DB.ReadTxn(), ipcache.PrefixIndex.Query(pfx(p))); ok {
		t.Fatalf("%s: row %+v, want none (the claim must be refused)", p, *e)
	}
}

// A CEP naming a reserved identity (host, health, remote-node, a
// user-reserved one), a node-local CIDR or remote-node-scope identity, a
// negative number or one that truncates to a valid identity is refused,
// even when a CiliumIdentity of that name in the CEP's namespace exists.
func TestCEPAttackReservedIdentity(t *testing.T) {
	r, d := trustedCluster(t)
	attacks := []struct {
		ip string
		id int64
	}{
		{"10.2.0.20", int64(identity.ReservedIdentityHost)},
		{"10.2.0.21", int64(identity.ReservedIdentityHealth)},
		{"10.2.0.22", int64(identity.ReservedIdentityRemoteNode)},
		{"10.2.0.23", int64(identity.ReservedIdentityKubeAPIServer)},
		{"10.2.0.24", 200}, // user-reserved
		{"10.2.0.25", 255},
		{"10.2.0.26", int64(identity.IdentityScopeLocal | 5)},      // a CIDR identity
		{"10.2.0.27", int64(identity.IdentityScopeRemoteNode | 1)}, // a remote-node-scope identity
		{"10.2.0.28", -2000},
		{"10.2.0.29", 1<<32 + 2000}, // 2000 once truncated to 32 bits
	}
	r.write(func(w statedb.WriteTxn) {
		for i, a := range attacks {
			_, _, _ = r.ids.Insert(w, cid(a.id, "default"))
			_, _, _ = r.ceps.Insert(w, cep("default", "evil-"+string(rune('a'+i)), "192.168.0.2", a.id, a.ip))
		}
		_, _, _ = r.ceps.Insert(w, cep("default", "web2", "192.168.0.2", 2000, "10.2.0.30"))
	})
	d.mustStep(t)
	wantRow(t, r, "10.2.0.30/32", 2000, "cep default/web2")
	for _, a := range attacks {
		wantNoRow(t, r, a.ip+"/32")
	}
}

// A CEP naming an identity no CiliumIdentity has is refused; it counts
// once the identity exists, and stops counting when it is deleted.
func TestCEPAttackUnknownIdentity(t *testing.T) {
	r, d := trustedCluster(t)
	r.write(func(w statedb.WriteTxn) {
		_, _, _ = r.ceps.Insert(w, cep("default", "ghost", "192.168.0.2", 4242, "10.2.0.20"))
	})
	d.mustStep(t)
	wantNoRow(t, r, "10.2.0.20/32")

	r.write(func(w statedb.WriteTxn) { _, _, _ = r.ids.Insert(w, cid(4242, "default")) })
	d.mustStep(t)
	wantRow(t, r, "10.2.0.20/32", 4242, "cep default/ghost")

	r.write(func(w statedb.WriteTxn) { _, _, _ = r.ids.Delete(w, cid(4242, "default")) })
	d.mustStep(t)
	wantNoRow(t, r, "10.2.0.20/32")
}

// A CEP naming an identity of another namespace, or one without a
// namespace label, is refused; kube-system's own CEP with kube-system's
// identity is not.
func TestCEPAttackNamespaceMismatch(t *testing.T) {
	r, d := trustedCluster(t)
	r.write(func(w statedb.WriteTxn) {
		_, _, _ = r.ids.Insert(w, cid(5000, ""))
		_, _, _ = r.ceps.Insert(w, cep("default", "as-dns", "192.168.0.2", 3000, "10.2.0.20"))
		_, _, _ = r.ceps.Insert(w, cep("default", "no-ns", "192.168.0.2", 5000, "10.2.0.21"))
		_, _, _ = r.ceps.Insert(w, cep("kube-system", "dns", "192.168.0.2", 3000, "10.2.0.22"))
	})
	d.mustStep(t)
	wantNoRow(t, r, "10.2.0.20/32")
	wantNoRow(t, r, "10.2.0.21/32")
	wantRow(t, r, "10.2.0.22/32", 3000, "cep kube-system/dns")
}

// A CEP with an address outside the pod CIDRs of the node it names (this
// node's pod CIDR, an outside address, one bad address among good ones),
// or naming no known node, is refused as a whole. It counts once the node
// it names exists with a pod CIDR holding its addresses, and stops
// counting when the CIDR moves.
func TestCEPAttackAddressOutsideNode(t *testing.T) {
	r, d := trustedCluster(t)
	r.write(func(w statedb.WriteTxn) {
		_, _, _ = r.ceps.Insert(w, cep("default", "local-range", "192.168.0.2", 2000, "10.1.0.50"))
		_, _, _ = r.ceps.Insert(w, cep("default", "outside", "192.168.0.2", 2000, "203.0.113.7"))
		_, _, _ = r.ceps.Insert(w, cep("default", "mixed", "192.168.0.2", 2000, "10.2.0.20", "8.8.8.8"))
		_, _, _ = r.ceps.Insert(w, cep("default", "router", "10.2.0.1", 2000, "10.2.0.21")) // not an InternalIP
		_, _, _ = r.ceps.Insert(w, cep("default", "n3", "192.168.0.3", 2000, "10.3.0.5"))
	})
	d.mustStep(t)
	for _, p := range []string{"10.1.0.50/32", "203.0.113.7/32", "10.2.0.20/32", "8.8.8.8/32", "10.2.0.21/32", "10.3.0.5/32"} {
		wantNoRow(t, r, p)
	}

	n3 := &nodes.Node{Name: "n3", PodCIDRs: []netip.Prefix{pfx("10.3.0.0/24")},
		Addresses: []nodes.Address{{Type: nodes.AddressInternalIP, IP: addr("192.168.0.3")}}}
	r.write(func(w statedb.WriteTxn) { _, _, _ = r.nodes.Insert(w, n3) })
	d.mustStep(t)
	wantRow(t, r, "10.3.0.5/32", 2000, "cep default/n3")
	if e, _, _ := r.IPCache.Get(r.DB.ReadTxn(), ipcache.PrefixIndex.Query(pfx("10.3.0.5/32"))); e.HostIP != addr("192.168.0.3") {
		t.Errorf("host IP %s, want the node's 192.168.0.3", e.HostIP)
	}

	moved := *n3
	moved.PodCIDRs = []netip.Prefix{pfx("10.4.0.0/24")}
	r.write(func(w statedb.WriteTxn) { _, _, _ = r.nodes.Insert(w, &moved) })
	d.mustStep(t)
	wantNoRow(t, r, "10.3.0.5/32")
}

// Two CEPs claim one address. The claim of a refused CEP never competes,
// whatever its name; two acceptable CEPs that disagree (identity or node)
// cancel each other out, so that the name an attacker picks decides
// nothing; two that agree keep the row.
func TestCEPAttackTieByName(t *testing.T) {
	r, d := trustedCluster(t)
	// "aaa" sorts before "web": it used to win the tie.
	r.write(func(w statedb.WriteTxn) {
		_, _, _ = r.ceps.Insert(w, cep("default", "aaa", "192.168.0.2", 3000, "10.2.0.9"))
	})
	d.mustStep(t)
	wantRow(t, r, "10.2.0.9/32", 2000, "cep default/web")

	// An acceptable CEP of another identity: neither wins.
	r.write(func(w statedb.WriteTxn) {
		_, _, _ = r.ceps.Insert(w, cep("default", "aab", "192.168.0.2", 2001, "10.2.0.9"))
	})
	d.mustStep(t)
	wantNoRow(t, r, "10.2.0.9/32")

	// It goes: the honest CEP's row is back.
	r.write(func(w statedb.WriteTxn) { _, _, _ = r.ceps.Delete(w, cep("default", "aab", "", 0)) })
	d.mustStep(t)
	wantRow(t, r, "10.2.0.9/32", 2000, "cep default/web")

	// A second CEP that agrees (the same identity on the same node)
	// changes nothing but, by name, the row's owner.
	r.write(func(w statedb.WriteTxn) {
		_, _, _ = r.ceps.Insert(w, cep("default", "web-copy", "192.168.0.2", 2000, "10.2.0.9"))
	})
	d.mustStep(t)
	wantRow(t, r, "10.2.0.9/32", 2000, "cep default/web")
}

// Each refusal is counted by reason, now and in total, and so is an
// address whose CEPs disagree; the counts follow the CEPs as they are
// fixed and deleted, and the job's health mentions them.
func TestCEPRefusalsCounted(t *testing.T) {
	r, d := trustedCluster(t)
	bad := []*ciliumv2.CiliumEndpoint{
		cep("default", "reserved", "192.168.0.2", 1, "10.2.0.20"),
		cep("default", "unknown", "192.168.0.2", 4242, "10.2.0.21"),
		cep("default", "other-ns", "192.168.0.2", 3000, "10.2.0.22"),
		cep("default", "no-node", "192.168.0.99", 2000, "10.2.0.23"),
		cep("default", "outside", "192.168.0.2", 2000, "10.1.0.23"),
		cep("default", "disagrees", "192.168.0.2", 2001, "10.2.0.9"),
	}
	r.write(func(w statedb.WriteTxn) {
		for _, c := range bad {
			_, _, _ = r.ceps.Insert(w, c)
		}
	})
	d.mustStep(t)
	s := d.Trust()
	for _, why := range Refusals {
		if s.Refused[why] != 1 || s.RefusedTotal[why] != 1 {
			t.Errorf("%s: %d refused now, %d in total, want 1 and 1", why, s.Refused[why], s.RefusedTotal[why])
		}
	}
	if s.Conflicts != 1 {
		t.Errorf("%d conflicts, want 1 (10.2.0.9)", s.Conflicts)
	}
	if msg := d.status(); !strings.Contains(msg, "5 CiliumEndpoints refused") || !strings.Contains(msg, "1 addresses with conflicting") {
		t.Errorf("health %q does not mention the refusals and the conflict", msg)
	}
	wantRefused(t, r, map[string]Refusal{"default/reserved": RefusedReservedIdentity, "default/unknown": RefusedUnknownIdentity,
		"default/other-ns": RefusedNamespaceMismatch, "default/no-node": RefusedUnknownNode, "default/outside": RefusedAddressOutsideNode})

	// The unknown identity appears; the reserved one changes reason;
	// the disagreeing CEP goes.
	r.write(func(w statedb.WriteTxn) {
		_, _, _ = r.ids.Insert(w, cid(4242, "default"))
		_, _, _ = r.ceps.Insert(w, cep("default", "reserved", "192.168.0.2", 3000, "10.2.0.20"))
		_, _, _ = r.ceps.Delete(w, bad[5])
	})
	d.mustStep(t)
	s = d.Trust()
	if s.Refused[RefusedUnknownIdentity] != 0 || s.Refused[RefusedReservedIdentity] != 0 || s.Refused[RefusedNamespaceMismatch] != 2 {
		t.Errorf("after the fixes: refused %v", s.Refused)
	}
	if s.RefusedTotal[RefusedNamespaceMismatch] != 2 || s.RefusedTotal[RefusedReservedIdentity] != 1 {
		t.Errorf("after the fixes: refused in total %v", s.RefusedTotal)
	}
	if s.Conflicts != 0 {
		t.Errorf("%d conflicts after the disagreeing CEP went", s.Conflicts)
	}
	wantRow(t, r, "10.2.0.21/32", 4242, "cep default/unknown")
	wantRefused(t, r, map[string]Refusal{"default/reserved": RefusedNamespaceMismatch,
		"default/other-ns": RefusedNamespaceMismatch, "default/no-node": RefusedUnknownNode, "default/outside": RefusedAddressOutsideNode})

	r.write(func(w statedb.WriteTxn) {
		for _, c := range bad {
			_, _, _ = r.ceps.Delete(w, c)
		}
	})
	d.mustStep(t)
	s = d.Trust()
	for why, n := range s.Refused {
		if n != 0 {
			t.Errorf("%s: %d refused after every bad CEP went", why, n)
		}
	}
	if msg := d.status(); strings.Contains(msg, "refused") {
		t.Errorf("health %q still mentions refusals", msg)
	}
	wantRefused(t, r, map[string]Refusal{})
}

// wantRefused checks the refused-CEPs table: want is its rows' CEPs and
// reasons.
func wantRefused(t *testing.T, r rw, want map[string]Refusal) {
	t.Helper()
	got := map[string]Refusal{}
	for rc := range r.Refused.All(r.DB.ReadTxn()) {
		got[rc.CEP] = rc.Reason
		if rc.Identity == 0 || rc.NodeIP == "" {
			t.Errorf("refused CEP %s: identity %d, node %q: want what its status claims", rc.CEP, rc.Identity, rc.NodeIP)
		}
	}
	if !maps.Equal(got, want) {
		t.Errorf("refused-CEPs table %v, want %v", got, want)
	}
}

// Before every input table is initialized a refusal is not news (a CEP
// listed ahead of its CiliumIdentity): it is counted only if it still
// holds once they are, and then once.
func TestCEPRefusalsReportedOnceSynced(t *testing.T) {
	r := newTables(t)
	wtxn := r.DB.WriteTxn(r.ids)
	idsDone := r.ids.RegisterInitializer(wtxn, "reflector")
	wtxn.Commit()
	d := newDeriver(t, r)
	r.write(func(w statedb.WriteTxn) {
		_, _, _ = r.nodes.Insert(w, &nodes.Node{Name: "n2", PodCIDRs: []netip.Prefix{pfx("10.2.0.0/24")},
			Addresses: []nodes.Address{{Type: nodes.AddressInternalIP, IP: addr("192.168.0.2")}}})
		_, _, _ = r.ceps.Insert(w, cep("default", "early", "192.168.0.2", 2000, "10.2.0.9"))
		_, _, _ = r.ceps.Insert(w, cep("default", "ghost", "192.168.0.2", 4242, "10.2.0.10"))
	})
	d.mustStep(t)
	if s := d.Trust(); s.RefusedTotal[RefusedUnknownIdentity] != 0 || s.Refused[RefusedUnknownIdentity] != 2 {
		t.Fatalf("before the identities are listed: %+v, want 2 refused now and none counted", s)
	}
	r.write(func(w statedb.WriteTxn) {
		_, _, _ = r.ids.Insert(w, cid(2000, "default"))
		idsDone(w)
	})
	d.mustStep(t)
	wantRow(t, r, "10.2.0.9/32", 2000, "cep default/early")
	s := d.Trust()
	if s.Refused[RefusedUnknownIdentity] != 1 || s.RefusedTotal[RefusedUnknownIdentity] != 1 {
		t.Fatalf("once listed: %+v, want default/ghost refused and counted once", s)
	}
	d.mustStep(t)
	if s := d.Trust(); s.RefusedTotal[RefusedUnknownIdentity] != 1 {
		t.Fatalf("counted again: %+v", s)
	}
}

// The health endpoint's CEP of another node (identity health on that
// node's health IP, as every agent publishes it) is neither claimed nor
// refused: the node's CiliumNode gives the address health. Identity health
// on any other address of the node is still refused.
func TestCEPOfNodeHealthEndpointNotRefused(t *testing.T) {
	r, d := trustedCluster(t)
	r.write(func(w statedb.WriteTxn) {
		_, _, _ = r.nodes.Insert(w, &nodes.Node{Name: "n2", PodCIDRs: []netip.Prefix{pfx("10.2.0.0/24")}, HealthIPv4: addr("10.2.0.2"),
			Addresses: []nodes.Address{{Type: nodes.AddressInternalIP, IP: addr("192.168.0.2")},
				{Type: nodes.AddressCiliumInternalIP, IP: addr("10.2.0.1")}}})
		_, _, _ = r.ceps.Insert(w, cep("kube-system", "cilium-health-n2", "192.168.0.2", int64(identity.ReservedIdentityHealth), "10.2.0.2"))
		_, _, _ = r.ceps.Insert(w, cep("default", "evil", "192.168.0.2", int64(identity.ReservedIdentityHealth), "10.2.0.21"))
	})
	d.mustStep(t)
	wantRow(t, r, "10.2.0.2/32", identity.ReservedIdentityHealth, "node n2")
	wantNoRow(t, r, "10.2.0.21/32")
	s := d.Trust()
	if s.Refused[RefusedReservedIdentity] != 1 {
		t.Errorf("%d CEPs refused for a reserved identity, want 1 (default/evil only)", s.Refused[RefusedReservedIdentity])
	}
	for rc := range r.Refused.All(r.DB.ReadTxn()) {
		if strings.Contains(rc.CEP, "cilium-health") {
			t.Errorf("the health endpoint's CEP is refused: %+v", rc)
		}
	}
}
