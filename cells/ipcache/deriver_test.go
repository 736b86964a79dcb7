package ipcache

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"

	"github.com/cilium/statedb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/ipcache"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/lb"
	"github.com/cellium/cellium/statedb/nodes"
	"github.com/cellium/cellium/statedb/policy"
	"github.com/cellium/cellium/statedb/reconciler"
)

// rw are the writable input tables a test fills.
type rw struct {
	Tables
	eps   statedb.RWTable[*endpoints.Endpoint]
	local statedb.RWTable[*nodes.LocalNode]
	nodes statedb.RWTable[*nodes.Node]
	ceps  statedb.RWTable[*ciliumv2.CiliumEndpoint]
	cidrs statedb.RWTable[*policy.CIDRIdentity]
	ids   statedb.RWTable[*ciliumv2.CiliumIdentity]
	fes   statedb.RWTable[*lb.Frontend]
}

func newTables(t *testing.T) rw {
	t.Helper()
	db := statedb.New()
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	var r rw
	var err error
	r.eps, err = endpoints.NewTable(db)
	must(err)
	r.local, err = nodes.NewLocalNodeTable(db)
	must(err)
	r.nodes, err = nodes.NewNodesTable(db)
	must(err)
	r.ceps, err = k8stables.NewCiliumEndpointsTable(db)
	must(err)
	r.cidrs, err = policy.NewCIDRTable(db)
	must(err)
	r.ids, err = k8stables.NewCiliumIdentitiesTable(db)
	must(err)
	r.fes, err = lb.NewFrontendsTable(db)
	must(err)
	ipc, err := ipcache.NewTable(db)
	must(err)
	refused, err := ipcache.NewRefusedTable(db)
	must(err)
	// The socket load balancer is on: its frontends are an input.
	r.Tables = Tables{DB: db, Endpoints: r.eps, LocalNode: r.local, Nodes: r.nodes, CEPs: r.ceps, CIDRs: r.cidrs,
		Identities: r.ids, Frontends: r.fes, IPCache: ipc, Refused: refused}
	return r
}

func (r rw) write(fn func(statedb.WriteTxn)) {
	wtxn := r.DB.WriteTxn(r.eps, r.local, r.nodes, r.ceps, r.cidrs, r.ids, r.fes)
	fn(wtxn)
	wtxn.Commit()
}

func newDeriver(t *testing.T, r rw) *Deriver {
	t.Helper()
	d := NewDeriver(r.Tables, nil)
	if err := d.Subscribe(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.close)
	return d
}

func (d *Deriver) mustStep(t *testing.T) {
	t.Helper()
	if _, err := d.step(); err != nil {
		t.Fatal(err)
	}
}

// rows returns the ipcache table without status.
func rows(txn statedb.ReadTxn, t statedb.Table[*ipcache.Entry]) map[netip.Prefix]*ipcache.Entry {
	out := map[netip.Prefix]*ipcache.Entry{}
	for e := range t.All(txn) {
		c := *e
		c.Status = reconciler.Status{}
		out[e.Prefix] = &c
	}
	return out
}

func diff(got, want map[netip.Prefix]*ipcache.Entry) string {
	var s string
	for p, w := range want {
		g, ok := got[p]
		if !ok {
			s += fmt.Sprintf("  missing %s: %+v\n", p, *w)
		} else if !g.SameAs(w) {
			s += fmt.Sprintf("  %s: got %+v, want %+v\n", p, *g, *w)
		}
	}
	for p, g := range got {
		if _, ok := want[p]; !ok {
			s += fmt.Sprintf("  stray %s: %+v\n", p, *g)
		}
	}
	return s
}

func cep(ns, name, nodeIP string, id int64, ips ...string) *ciliumv2.CiliumEndpoint {
	c := &ciliumv2.CiliumEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if id != 0 {
		c.Status.Identity = &ciliumv2.EndpointIdentity{ID: id}
	}
	c.Status.Networking = &ciliumv2.EndpointNetworking{NodeIP: nodeIP}
	for _, ip := range ips {
		c.Status.Networking.Addressing = append(c.Status.Networking.Addressing, &ciliumv2.AddressPair{IPV4: ip})
	}
	return c
}

var (
	pfx  = netip.MustParsePrefix
	addr = netip.MustParseAddr
)

// Every source lands in the table with its identity, and a prefix two
// sources claim goes to the higher precedence.
func TestDeriveSourcesAndPrecedence(t *testing.T) {
	r := newTables(t)
	d := newDeriver(t, r)
	r.write(func(w statedb.WriteTxn) {
		_, _, _ = r.local.Insert(w, &nodes.LocalNode{Name: "n1", InternalIP: addr("192.168.0.1"), RouterIP: addr("10.1.0.1"),
			HealthIPv4: addr("10.1.0.2")})
		_, _, _ = r.nodes.Insert(w, &nodes.Node{Name: "n1", Local: true, Addresses: []nodes.Address{{Type: nodes.AddressInternalIP, IP: addr("192.168.0.1")}}})
		_, _, _ = r.nodes.Insert(w, &nodes.Node{Name: "n2", Addresses: []nodes.Address{
			{Type: nodes.AddressInternalIP, IP: addr("192.168.0.2")}, {Type: nodes.AddressCiliumInternalIP, IP: addr("10.2.0.1")}},
			HealthIPv4: addr("10.2.0.2"), PodCIDRs: []netip.Prefix{pfx("10.2.0.0/24")}})
		for _, id := range []int64{2000, 2001, 2002} {
			_, _, _ = r.ids.Insert(w, cid(id, "default"))
		}
		_, _, _ = r.eps.Insert(w, &endpoints.Endpoint{ID: 7, IPv4: addr("10.1.0.7"), Identity: 1234})
		_, _, _ = r.eps.Insert(w, &endpoints.Endpoint{ID: 8, IPv4: addr("10.1.0.8")}) // no identity yet
		_, _, _ = r.eps.Insert(w, &endpoints.Endpoint{ID: 9, IPv4: addr("10.1.0.2"), Health: true})
		// A remote pod, a stale CEP of a local pod, and a CEP of another
		// node claiming the local endpoint's address (refused: outside
		// its node's pod CIDR).
		_, _, _ = r.ceps.Insert(w, cep("default", "remote", "192.168.0.2", 2000, "10.2.0.9"))
		_, _, _ = r.ceps.Insert(w, cep("default", "local", "192.168.0.1", 2001, "10.1.0.99"))
		_, _, _ = r.ceps.Insert(w, cep("default", "clash", "192.168.0.2", 2002, "10.1.0.7"))
		_, _, _ = r.cidrs.Insert(w, &policy.CIDRIdentity{Prefix: pfx("203.0.113.0/24"), Identity: 16777217})
		_, _, _ = r.cidrs.Insert(w, &policy.CIDRIdentity{Prefix: pfx("10.2.0.9/32"), Identity: 16777218})
	})
	d.mustStep(t)

	want := map[string]struct {
		id     identity.NumericIdentity
		source ipcache.Source
		hostIP string
	}{
		"192.168.0.1/32": {1, ipcache.SourceHost, ""},
		"10.1.0.1/32":    {1, ipcache.SourceHost, ""},
		"10.1.0.2/32":    {4, ipcache.SourceHealth, ""},
		"192.168.0.2/32": {6, ipcache.SourceRemoteNode, "192.168.0.2"},
		"10.2.0.1/32":    {6, ipcache.SourceRemoteNode, "192.168.0.2"},
		"10.2.0.2/32":    {4, ipcache.SourceHealth, "192.168.0.2"},
		"10.1.0.7/32":    {1234, ipcache.SourceEndpoint, ""},
		"10.2.0.9/32":    {2000, ipcache.SourceCiliumEndpoint, "192.168.0.2"},
		"203.0.113.0/24": {16777217, ipcache.SourcePolicyCIDR, ""},
		// The remote node's pod CIDR: world, living on that node.
		"10.2.0.0/24": {2, ipcache.SourceNodeCIDR, "192.168.0.2"},
	}
	got := rows(r.DB.ReadTxn(), r.IPCache)
	for p, w := range want {
		e, ok := got[pfx(p)]
		if !ok {
			t.Errorf("%s: no row", p)
			continue
		}
		var host string
		if e.HostIP.IsValid() {
			host = e.HostIP.String()
		}
		if e.Identity != w.id || e.Source != w.source || host != w.hostIP {
			t.Errorf("%s: got identity %d source %s host %q, want %d %s %q", p, e.Identity, e.Source, host, w.id, w.source, w.hostIP)
		}
	}
	if len(got) != len(want) {
		t.Errorf("got %d rows, want %d: %s", len(got), len(want), diff(got, FromScratch(r.DB.ReadTxn(), r.Tables)))
	}
	if n := r.IPCache.NumObjects(r.DB.ReadTxn()); n != len(want) {
		t.Errorf("%d rows", n)
	}
	byHost := 0
	for e := range r.IPCache.All(r.DB.ReadTxn()) {
		if e.Source == ipcache.SourceHost {
			byHost++
		}
	}
	if byHost != 2 {
		t.Errorf("%d host rows, want 2", byHost)
	}

	// The endpoint goes: the clashing CEP still does not take the
	// address.
	r.write(func(w statedb.WriteTxn) { _, _, _ = r.eps.Delete(w, &endpoints.Endpoint{ID: 7}) })
	d.mustStep(t)
	if e, _, ok := r.IPCache.Get(r.DB.ReadTxn(), ipcache.PrefixIndex.Query(pfx("10.1.0.7/32"))); ok {
		t.Errorf("after the endpoint's deletion: %+v, want no row (the CEP default/clash is refused)", e)
	}
}

// A node that goes (its CiliumNode deleted) takes every entry it gave
// with it: its addresses, router and health IPs, pod CIDR, and the
// addresses of its pods' CiliumEndpoints (refused now: unknown node); the
// local node's rows stay host. A policy CIDR equal to its pod CIDR is the
// row's CIDR identity while the node is there, the row after.
func TestDeriveNodeLeavesNothingBehind(t *testing.T) {
	r := newTables(t)
	d := newDeriver(t, r)
	n2 := &nodes.Node{Name: "n2", Addresses: []nodes.Address{
		{Type: nodes.AddressInternalIP, IP: addr("192.168.0.2")}, {Type: nodes.AddressExternalIP, IP: addr("198.51.100.2")},
		{Type: nodes.AddressCiliumInternalIP, IP: addr("10.2.0.1")}},
		HealthIPv4: addr("10.2.0.2"), PodCIDRs: []netip.Prefix{pfx("10.2.0.0/24"), pfx("10.3.0.0/24")}}
	r.write(func(w statedb.WriteTxn) {
		_, _, _ = r.local.Insert(w, &nodes.LocalNode{Name: "n1", InternalIP: addr("192.168.0.1"), RouterIP: addr("10.1.0.1"),
			PodCIDRs: []netip.Prefix{pfx("10.1.0.0/24")}})
		_, _, _ = r.nodes.Insert(w, &nodes.Node{Name: "n1", Local: true, Addresses: []nodes.Address{{Type: nodes.AddressInternalIP, IP: addr("192.168.0.1")}},
			PodCIDRs: []netip.Prefix{pfx("10.1.0.0/24")}})
		_, _, _ = r.nodes.Insert(w, n2)
		_, _, _ = r.ids.Insert(w, cid(2000, "default"))
		_, _, _ = r.ceps.Insert(w, cep("default", "remote", "192.168.0.2", 2000, "10.2.0.9"))
		_, _, _ = r.cidrs.Insert(w, &policy.CIDRIdentity{Prefix: pfx("10.3.0.0/24"), Identity: 16777217})
	})
	d.mustStep(t)
	got := rows(r.DB.ReadTxn(), r.IPCache)
	var fromN2 []string
	for p, e := range got {
		if e.HostIP == addr("192.168.0.2") {
			fromN2 = append(fromN2, p.String())
		}
	}
	// InternalIP, ExternalIP, router IP, health IP, two pod CIDRs, a pod.
	if len(fromN2) != 7 {
		t.Errorf("rows on n2: %v, want 7", fromN2)
	}
	if e := got[pfx("10.3.0.0/24")]; e == nil || e.Source != ipcache.SourceNodeCIDR || e.CIDRIdentity != 16777217 {
		t.Errorf("10.3.0.0/24 = %+v, want node-cidr with CIDR identity 16777217", e)
	}
	if e := got[pfx("10.1.0.0/24")]; e != nil {
		t.Errorf("the local pod CIDR has a row: %+v", e)
	}

	r.write(func(w statedb.WriteTxn) { _, _, _ = r.nodes.Delete(w, n2) })
	d.mustStep(t)
	got = rows(r.DB.ReadTxn(), r.IPCache)
	want := map[netip.Prefix]*ipcache.Entry{
		pfx("192.168.0.1/32"): {Prefix: pfx("192.168.0.1/32"), Identity: 1, Source: ipcache.SourceHost, Owner: localNodeOwner},
		pfx("10.1.0.1/32"):    {Prefix: pfx("10.1.0.1/32"), Identity: 1, Source: ipcache.SourceHost, Owner: localNodeOwner},
		pfx("10.3.0.0/24"):    {Prefix: pfx("10.3.0.0/24"), Identity: 16777217, Source: ipcache.SourcePolicyCIDR, Owner: cidrOwner(pfx("10.3.0.0/24"))},
	}
	if s := diff(got, want); s != "" {
		t.Errorf("after n2 left:\n%s", s)
	}
	if tr := d.Trust(); tr.Refused[RefusedUnknownNode] != 1 {
		t.Errorf("refused %v, want the CEP of n2 refused as unknown-node", tr.Refused)
	}
}

// The table is initialized (so the map may be pruned) only once the
// local node has its router IP.
func TestDeriveInitializedAfterRouterIP(t *testing.T) {
	r := newTables(t)
	d := newDeriver(t, r)
	d.mustStep(t)
	if ok, _ := r.IPCache.Initialized(r.DB.ReadTxn()); ok {
		t.Fatal("initialized before the local node is known")
	}
	// Pod CIDRs but no router IP yet: the router IP is coming.
	cidrs := []netip.Prefix{netip.MustParsePrefix("10.1.0.0/24")}
	r.write(func(w statedb.WriteTxn) {
		_, _, _ = r.local.Insert(w, &nodes.LocalNode{Name: "n1", InternalIP: addr("192.168.0.1"), PodCIDRs: cidrs})
	})
	d.mustStep(t)
	if ok, _ := r.IPCache.Initialized(r.DB.ReadTxn()); ok {
		t.Fatal("initialized with pod CIDRs but before the router IP")
	}
	r.write(func(w statedb.WriteTxn) {
		_, _, _ = r.local.Insert(w, &nodes.LocalNode{Name: "n1", InternalIP: addr("192.168.0.1"), PodCIDRs: cidrs, RouterIP: addr("10.1.0.1")})
	})
	d.mustStep(t)
	if ok, _ := r.IPCache.Initialized(r.DB.ReadTxn()); !ok {
		t.Fatal("not initialized with every input initialized and the router IP known")
	}
}

// A node without pod CIDRs (the operator has not served its CiliumNode)
// can have no router IP: the table is initialized without one.
func TestDeriveInitializedWithoutPodCIDRs(t *testing.T) {
	r := newTables(t)
	d := newDeriver(t, r)
	r.write(func(w statedb.WriteTxn) {
		_, _, _ = r.local.Insert(w, &nodes.LocalNode{Name: "n1", InternalIP: addr("192.168.0.1")})
	})
	d.mustStep(t)
	if ok, _ := r.IPCache.Initialized(r.DB.ReadTxn()); !ok {
		t.Fatal("not initialized for a node without pod CIDRs")
	}
}

// Incremental derivation equals a from-scratch computation after every
// round of random churn of endpoints, the local node, nodes (their pod
// CIDRs too), CEPs, CiliumIdentities, CIDRs and Service frontends over a
// small address space (so that claims collide often and CEPs pass and fail
// the trust checks as their nodes and identities come and go).
func TestDeriveIncrementalEqualsFromScratch(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 1))
			r := newTables(t)
			d := newDeriver(t, r)
			ip := func() netip.Addr { return netip.AddrFrom4([4]byte{10, 0, 0, byte(rng.IntN(24))}) }
			maybeIP := func() netip.Addr {
				if rng.IntN(4) == 0 {
					return netip.Addr{}
				}
				return ip()
			}
			// Node i's InternalIP is mostly 192.168.0.i, which the CEPs
			// name.
			nodeIP := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{192, 168, 0, byte(i)}) }
			node := func() *nodes.Node {
				i := rng.IntN(4)
				n := &nodes.Node{Name: fmt.Sprintf("n%d", i), HealthIPv4: maybeIP()}
				n.Local = n.Name == "n0" && rng.IntN(2) == 0
				if rng.IntN(4) > 0 {
					n.Addresses = append(n.Addresses, nodes.Address{Type: nodes.AddressInternalIP, IP: nodeIP(i + rng.IntN(2))})
				}
				for range rng.IntN(3) {
					typ := []string{nodes.AddressInternalIP, nodes.AddressExternalIP, nodes.AddressCiliumInternalIP}[rng.IntN(3)]
					n.Addresses = append(n.Addresses, nodes.Address{Type: typ, IP: ip()})
				}
				for range rng.IntN(3) {
					n.PodCIDRs = append(n.PodCIDRs, []netip.Prefix{pfx("10.0.0.0/28"), pfx("10.0.0.16/28"), pfx("10.0.0.0/27"), pfx("10.0.0.0/27")}[rng.IntN(4)])
				}
				return n
			}
			ns := func() string { return []string{"ns", "ns", "ns", "other"}[rng.IntN(4)] }
			cepID := func() int64 { return []int64{0, 5, 1000, 1000, 2000, 2000, 3000}[rng.IntN(7)] }
			for round := range 60 {
				r.write(func(w statedb.WriteTxn) {
					for range 1 + rng.IntN(8) {
						switch rng.IntN(14) {
						case 0, 1:
							e := &endpoints.Endpoint{ID: uint16(1 + rng.IntN(6)), IPv4: maybeIP(), Health: rng.IntN(8) == 0}
							if rng.IntN(3) > 0 {
								e.Identity = identity.NumericIdentity(1000 + rng.IntN(3))
							}
							_, _, _ = r.eps.Insert(w, e)
						case 2:
							_, _, _ = r.eps.Delete(w, &endpoints.Endpoint{ID: uint16(1 + rng.IntN(6))})
						case 3:
							ln := &nodes.LocalNode{Name: "n0", InternalIP: maybeIP(), RouterIP: maybeIP(), HealthIPv4: maybeIP()}
							if rng.IntN(2) == 0 {
								ln.NodeAddresses = []nodes.Address{{Type: nodes.AddressExternalIP, IP: ip()}}
							}
							_, _, _ = r.local.Insert(w, ln)
						case 4:
							_, _, _ = r.nodes.Insert(w, node())
						case 5:
							_, _, _ = r.nodes.Delete(w, &nodes.Node{Name: fmt.Sprintf("n%d", rng.IntN(4))})
						case 6, 7:
							var ips []string
							for range rng.IntN(3) {
								ips = append(ips, ip().String())
							}
							_, _, _ = r.ceps.Insert(w, cep(ns(), fmt.Sprintf("c%d", rng.IntN(6)), nodeIP(rng.IntN(5)).String(), cepID(), ips...))
						case 8:
							_, _, _ = r.ceps.Delete(w, cep(ns(), fmt.Sprintf("c%d", rng.IntN(6)), "", 0))
						case 9:
							p := netip.PrefixFrom(ip(), []int{24, 30, 32}[rng.IntN(3)]).Masked()
							if rng.IntN(3) == 0 {
								_, _, _ = r.cidrs.Delete(w, &policy.CIDRIdentity{Prefix: p})
							} else {
								_, _, _ = r.cidrs.Insert(w, &policy.CIDRIdentity{Prefix: p, Identity: identity.NumericIdentity(16777216 + rng.IntN(4))})
							}
						case 10, 11:
							c := cid(cepID(), ns())
							if rng.IntN(3) == 0 {
								_, _, _ = r.ids.Delete(w, c)
							} else {
								_, _, _ = r.ids.Insert(w, c)
							}
						case 12:
							// Two ports per address: one port's
							// frontend going must not unmark it.
							_, _, _ = r.fes.Insert(w, &lb.Frontend{Address: lb.L4Addr{Addr: ip(), Port: uint16(53 + rng.IntN(2)), Proto: lb.UDP}})
						case 13:
							_, _, _ = r.fes.Delete(w, &lb.Frontend{Address: lb.L4Addr{Addr: ip(), Port: uint16(53 + rng.IntN(2)), Proto: lb.UDP}})
						}
					}
				})
				d.mustStep(t)
				txn := r.DB.ReadTxn()
				s := diff(rows(txn, r.IPCache), FromScratch(txn, r.Tables))
				if ok, _ := r.IPCache.Initialized(txn); !ok {
					// Before initialization rows without a claim stay.
					s = withoutStrays(s)
				}
				if s != "" {
					t.Fatalf("round %d: incremental != from scratch:\n%s", round, s)
				}
			}
		})
	}
}

// withoutStrays drops diff's "stray" lines.
func withoutStrays(s string) string {
	var out string
	for _, l := range strings.SplitAfter(s, "\n") {
		if !strings.HasPrefix(l, "  stray ") {
			out += l
		}
	}
	return out
}

// An agent restart: the CEP of a local pod claims its address while the
// deriver does not know the node is its own (here the nodes table holds it
// as any other node, so that the CEP passes the trust checks); when the
// local node becomes known the CEP stops counting and the restored
// endpoint has no identity yet. Before the
// table is initialized the row must stay (deleting it would delete the
// map entry the running pod relies on: the CI failure of
// TestPrivilegedDatapathAgentRestart); once initialized, a prefix nobody
// claims goes.
func TestDeriveKeepsUnclaimedRowsUntilInitialized(t *testing.T) {
	r := newTables(t)
	wtxn := r.DB.WriteTxn(r.eps)
	restoreDone := r.eps.RegisterInitializer(wtxn, "restore")
	wtxn.Commit()
	d := newDeriver(t, r)
	get := func() (*ipcache.Entry, bool) {
		e, _, ok := r.IPCache.Get(r.DB.ReadTxn(), ipcache.PrefixIndex.Query(pfx("10.1.0.7/32")))
		return e, ok
	}
	r.write(func(w statedb.WriteTxn) {
		_, _, _ = r.eps.Insert(w, &endpoints.Endpoint{ID: 7, IPv4: addr("10.1.0.7")}) // restored, identity pending
		_, _, _ = r.eps.Insert(w, &endpoints.Endpoint{ID: 8, IPv4: addr("10.1.0.8")})
		_, _, _ = r.nodes.Insert(w, &nodes.Node{Name: "n1", PodCIDRs: []netip.Prefix{pfx("10.1.0.0/24")},
			Addresses: []nodes.Address{{Type: nodes.AddressInternalIP, IP: addr("192.168.0.1")}}})
		_, _, _ = r.ids.Insert(w, cid(2001, "default"))
		_, _, _ = r.ids.Insert(w, cid(2002, "default"))
		_, _, _ = r.ceps.Insert(w, cep("default", "a", "192.168.0.1", 2001, "10.1.0.7"))
		_, _, _ = r.ceps.Insert(w, cep("default", "b", "192.168.0.1", 2002, "10.1.0.8"))
	})
	d.mustStep(t)
	if e, ok := get(); !ok || e.Identity != 2001 {
		t.Fatalf("before the local node is known the CEP claims the address: got %+v", e)
	}
	r.write(func(w statedb.WriteTxn) {
		_, _, _ = r.local.Insert(w, &nodes.LocalNode{Name: "n1", InternalIP: addr("192.168.0.1"), RouterIP: addr("10.1.0.1")})
	})
	d.mustStep(t)
	if e, ok := get(); !ok || e.Identity != 2001 {
		t.Fatalf("the row went before the table was initialized: got %+v, %v", e, ok)
	}
	r.write(func(w statedb.WriteTxn) {
		_, _, _ = r.eps.Insert(w, &endpoints.Endpoint{ID: 7, IPv4: addr("10.1.0.7"), Identity: 2001})
	})
	d.mustStep(t)
	if e, ok := get(); !ok || e.Source != ipcache.SourceEndpoint {
		t.Fatalf("the endpoint's identity should win: got %+v", e)
	}
	// Restore done: endpoint 8 never got an identity, so 10.1.0.8 goes.
	wtxn = r.DB.WriteTxn(r.eps)
	restoreDone(wtxn)
	wtxn.Commit()
	d.mustStep(t)
	txn := r.DB.ReadTxn()
	if ok, _ := r.IPCache.Initialized(txn); !ok {
		t.Fatal("not initialized")
	}
	if s := diff(rows(txn, r.IPCache), FromScratch(txn, r.Tables)); s != "" {
		t.Fatalf("after initialization the table must equal its sources:\n%s", s)
	}
	if _, _, ok := r.IPCache.Get(txn, ipcache.PrefixIndex.Query(pfx("10.1.0.8/32"))); ok {
		t.Fatal("10.1.0.8/32 is claimed by nobody and stayed after initialization")
	}
}

// A policy CIDR that holds a pod's address (an ipBlock naming pods) loses
// the prefix to the endpoint but lends it its identity as CIDRIdentity:
// the most specific CIDR's, the /32 itself included; a CIDR row keeps
// none; removing the CIDRs clears it.
func TestDeriveCIDRIdentityOfPodAddresses(t *testing.T) {
	r := newTables(t)
	d := newDeriver(t, r)
	const wide, narrow, exact = 1<<24 | 1, 1<<24 | 2, 1<<24 | 3
	get := func(p string) *ipcache.Entry {
		t.Helper()
		e, _, ok := r.IPCache.Get(r.DB.ReadTxn(), ipcache.PrefixIndex.Query(pfx(p)))
		if !ok {
			t.Fatalf("no row %s", p)
		}
		return e
	}
	r.write(func(w statedb.WriteTxn) {
		// A node without pod CIDRs: the table is initialized at once.
		_, _, _ = r.local.Insert(w, &nodes.LocalNode{Name: "n1", InternalIP: addr("192.168.0.1")})
		_, _, _ = r.eps.Insert(w, &endpoints.Endpoint{ID: 7, IPv4: addr("10.1.0.7"), Identity: 1234})
		_, _, _ = r.eps.Insert(w, &endpoints.Endpoint{ID: 8, IPv4: addr("10.1.1.8"), Identity: 1234})
		_, _, _ = r.cidrs.Insert(w, &policy.CIDRIdentity{Prefix: pfx("10.1.0.0/16"), Identity: wide})
	})
	d.mustStep(t)
	if e := get("10.1.0.7/32"); e.Identity != 1234 || e.CIDRIdentity != wide {
		t.Fatalf("10.1.0.7 in 10.1.0.0/16: %+v", e)
	}
	if e := get("10.1.0.0/16"); e.CIDRIdentity != 0 {
		t.Errorf("the CIDR's own row carries a CIDR identity: %+v", e)
	}
	r.write(func(w statedb.WriteTxn) {
		_, _, _ = r.cidrs.Insert(w, &policy.CIDRIdentity{Prefix: pfx("10.1.0.0/24"), Identity: narrow})
		_, _, _ = r.cidrs.Insert(w, &policy.CIDRIdentity{Prefix: pfx("10.1.1.8/32"), Identity: exact})
	})
	d.mustStep(t)
	if e := get("10.1.0.7/32"); e.CIDRIdentity != narrow {
		t.Errorf("10.1.0.7: CIDR identity %d, want the /24's %d", e.CIDRIdentity, narrow)
	}
	if e := get("10.1.1.8/32"); e.Identity != 1234 || e.Source != ipcache.SourceEndpoint || e.CIDRIdentity != exact {
		t.Errorf("10.1.1.8: %+v, want the endpoint's identity with the /32 CIDR's %d", e, exact)
	}
	r.write(func(w statedb.WriteTxn) {
		for _, p := range []string{"10.1.0.0/16", "10.1.0.0/24", "10.1.1.8/32"} {
			_, _, _ = r.cidrs.Delete(w, &policy.CIDRIdentity{Prefix: pfx(p)})
		}
	})
	d.mustStep(t)
	if e := get("10.1.0.7/32"); e.CIDRIdentity != 0 {
		t.Errorf("after the CIDRs went: %+v", e)
	}
	txn := r.DB.ReadTxn()
	if s := diff(rows(txn, r.IPCache), FromScratch(txn, r.Tables)); s != "" {
		t.Fatalf("incremental != from scratch:\n%s", s)
	}
}

// A Service frontend's address (socket load balancer on) is a world row
// marked ServiceFrontend, the policy CIDRs holding it lending their
// identity; it stays while any port of the address is a frontend and
// goes with the last; a policy CIDR naming exactly the address does not
// unmark it, a pod or node holding it does.
func TestDeriveServiceFrontends(t *testing.T) {
	r := newTables(t)
	d := newDeriver(t, r)
	dns := lb.L4Addr{Addr: addr("10.96.0.10"), Port: 53, Proto: lb.UDP}
	dnsTCP := lb.L4Addr{Addr: addr("10.96.0.10"), Port: 53, Proto: lb.TCP}
	web := lb.L4Addr{Addr: addr("10.96.0.20"), Port: 80, Proto: lb.TCP}
	const serviceCIDR, exact = 1<<24 | 1, 1<<24 | 2
	r.write(func(w statedb.WriteTxn) {
		_, _, _ = r.local.Insert(w, &nodes.LocalNode{Name: "n1", InternalIP: addr("192.168.0.1")})
		for _, a := range []lb.L4Addr{dns, dnsTCP, web} {
			_, _, _ = r.fes.Insert(w, &lb.Frontend{Address: a, Service: "kube-system/kube-dns"})
		}
		_, _, _ = r.cidrs.Insert(w, &policy.CIDRIdentity{Prefix: pfx("10.96.0.0/12"), Identity: serviceCIDR})
	})
	d.mustStep(t)
	get := func(p string) *ipcache.Entry {
		t.Helper()
		e, _, _ := r.IPCache.Get(r.DB.ReadTxn(), ipcache.PrefixIndex.Query(pfx(p)))
		return e
	}
	want := func(what, p string, w *ipcache.Entry) {
		t.Helper()
		g := get(p)
		switch {
		case w == nil && g != nil:
			t.Errorf("%s: %s has row %+v, want none", what, p, *g)
		case w != nil && g == nil:
			t.Errorf("%s: %s has no row, want %+v", what, p, *w)
		case w != nil && !g.SameAs(w):
			t.Errorf("%s: %s is %+v, want %+v", what, p, *g, *w)
		}
	}
	frontend := func(p, owner string, cidr identity.NumericIdentity) *ipcache.Entry {
		return &ipcache.Entry{Prefix: pfx(p), Identity: identity.ReservedIdentityWorld, Source: ipcache.SourceServiceFrontend,
			Owner: owner, CIDRIdentity: cidr, ServiceFrontend: true}
	}
	want("three frontends", "10.96.0.10/32", frontend("10.96.0.10/32", "frontend 10.96.0.10:53/TCP", serviceCIDR))
	want("three frontends", "10.96.0.20/32", frontend("10.96.0.20/32", "frontend 10.96.0.20:80/TCP", serviceCIDR))

	// toCIDR: 10.96.0.10/32 (written for kube-proxy's path) keeps the
	// mark, its identity lent as CIDRIdentity.
	r.write(func(w statedb.WriteTxn) {
		_, _, _ = r.cidrs.Insert(w, &policy.CIDRIdentity{Prefix: pfx("10.96.0.10/32"), Identity: exact})
	})
	d.mustStep(t)
	want("a policy CIDR names the address", "10.96.0.10/32", frontend("10.96.0.10/32", "frontend 10.96.0.10:53/TCP", exact))

	// One of the address's two ports goes: still marked.
	r.write(func(w statedb.WriteTxn) { _, _, _ = r.fes.Delete(w, &lb.Frontend{Address: dnsTCP}) })
	d.mustStep(t)
	want("one port left", "10.96.0.10/32", frontend("10.96.0.10/32", "frontend 10.96.0.10:53/UDP", exact))

	// An endpoint holding a frontend's address (a misconfigured pod
	// CIDR) keeps it: the pod stays reachable.
	r.write(func(w statedb.WriteTxn) {
		_, _, _ = r.eps.Insert(w, &endpoints.Endpoint{ID: 5, IPv4: addr("10.96.0.20"), Identity: 1234})
	})
	d.mustStep(t)
	want("an endpoint holds the address", "10.96.0.20/32", &ipcache.Entry{Prefix: pfx("10.96.0.20/32"), Identity: 1234,
		Source: ipcache.SourceEndpoint, Owner: "endpoint 5", CIDRIdentity: serviceCIDR})

	// The last frontend of an address goes: so does the mark; the /32
	// CIDR's own row remains.
	r.write(func(w statedb.WriteTxn) {
		_, _, _ = r.fes.Delete(w, &lb.Frontend{Address: dns})
		_, _, _ = r.eps.Delete(w, &endpoints.Endpoint{ID: 5})
	})
	d.mustStep(t)
	want("no frontend left", "10.96.0.10/32", &ipcache.Entry{Prefix: pfx("10.96.0.10/32"), Identity: exact,
		Source: ipcache.SourcePolicyCIDR, Owner: "cidr 10.96.0.10/32"})
	want("the endpoint gone", "10.96.0.20/32", frontend("10.96.0.20/32", "frontend 10.96.0.20:80/TCP", serviceCIDR))
	r.write(func(w statedb.WriteTxn) { _, _, _ = r.fes.Delete(w, &lb.Frontend{Address: web}) })
	d.mustStep(t)
	want("every frontend gone", "10.96.0.20/32", nil)
	txn := r.DB.ReadTxn()
	if s := diff(rows(txn, r.IPCache), FromScratch(txn, r.Tables)); s != "" {
		t.Errorf("incremental != from scratch:\n%s", s)
	}
}

// The frontends are an input like the others: the table (and so the
// map's pruning) is initialized only once the frontends table is, so a
// restarted agent never removes the marks for a moment. Without the
// frontends (socket LB off) nothing is marked, whatever the table holds.
func TestDeriveServiceFrontendsInitAndOff(t *testing.T) {
	r := newTables(t)
	wtxn := r.DB.WriteTxn(r.fes)
	fesDone := r.fes.RegisterInitializer(wtxn, "k8s-services")
	wtxn.Commit()
	d := newDeriver(t, r)
	r.write(func(w statedb.WriteTxn) {
		_, _, _ = r.local.Insert(w, &nodes.LocalNode{Name: "n1", InternalIP: addr("192.168.0.1")})
		_, _, _ = r.fes.Insert(w, &lb.Frontend{Address: lb.L4Addr{Addr: addr("10.96.0.10"), Port: 53, Proto: lb.UDP}})
	})
	d.mustStep(t)
	if ok, _ := r.IPCache.Initialized(r.DB.ReadTxn()); ok {
		t.Fatal("initialized before the frontends table")
	}
	wtxn = r.DB.WriteTxn(r.fes)
	fesDone(wtxn)
	wtxn.Commit()
	d.mustStep(t)
	txn := r.DB.ReadTxn()
	if ok, _ := r.IPCache.Initialized(txn); !ok {
		t.Fatal("not initialized once the frontends table is")
	}
	if e, _, ok := r.IPCache.Get(txn, ipcache.PrefixIndex.Query(pfx("10.96.0.10/32"))); !ok || !e.ServiceFrontend {
		t.Fatalf("10.96.0.10/32: %+v, %v; want it marked", e, ok)
	}

	off := r
	off.Frontends = nil
	if got := FromScratch(txn, off.Tables); got[pfx("10.96.0.10/32")] != nil {
		t.Errorf("socket LB off: %+v", got[pfx("10.96.0.10/32")])
	}
}
