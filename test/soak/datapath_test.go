package soak

import (
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/policy"
	"github.com/cellium/cellium/test/devkubelet"
)

// withDatapath adds to a clean snapshot the datapath state of its
// endpoints: every invariant holds.
func withDatapath(s *Snapshot) *Snapshot {
	d := &Datapath{
		LXC: map[string]LXCEntry{}, LXCTable: map[string]LXCEntry{},
		IPCache: map[string]int64{}, IPCacheTable: map[string]IPCacheRow{},
		PolicyMaps: map[int64]bool{}, Links: map[int64]map[string]uint32{},
		Policies: map[int64]*policy.EndpointPolicyRow{}, PolicyContent: map[int64]map[policy.Key]bool{},
	}
	for _, ep := range s.Endpoints {
		ip := endpointIP(&ep)
		e := LXCEntry{ID: ep.ID, Identity: endpointIdentity(&ep)}
		if ep.Spec != nil {
			e.IfIndex = uint32(ep.Spec.InterfaceIndex)
		}
		d.LXC[ip], d.LXCTable[ip] = e, e
		d.IPCache[ip+"/32"] = e.Identity
		d.IPCacheTable[ip+"/32"] = IPCacheRow{Identity: e.Identity, Owner: "endpoint " + itoa(ep.ID)}
		d.PolicyMaps[ep.ID] = true
		// Each endpoint's policy: ingress from identity 1001 on tcp/80
		// and a deny of identity 1002, egress allow-all.
		pol := &policy.EndpointPolicy{Revision: 7,
			Ingress: policy.DirectionPolicy{Enforcing: true, Entries: []policy.Entry{
				{Key: policy.NewKey(1001, policy.Ingress, 6, 80, 16)},
				{Key: policy.NewKey(1002, policy.Ingress, 0, 0, 0), Deny: true},
			}},
			Egress: policy.DirectionPolicy{Entries: []policy.Entry{{Key: policy.NewKey(0, policy.Egress, 0, 0, 0)}}},
		}
		d.Policies[ep.ID] = &policy.EndpointPolicyRow{EndpointID: uint16(ep.ID), Identity: identity.NumericIdentity(e.Identity), Policy: pol}
		d.PolicyContent[ep.ID] = map[policy.Key]bool{}
		for _, en := range append(slices.Clone(pol.Ingress.Entries), pol.Egress.Entries...) {
			d.PolicyContent[ep.ID][en.Key] = en.Deny
		}
		d.Links[ep.ID] = map[string]uint32{"cil_from_container": e.IfIndex, "cil_to_container": e.IfIndex}
	}
	// The router and the world: rows of no endpoint.
	d.IPCache["10.0.0.1/32"] = 1
	d.IPCacheTable["10.0.0.1/32"] = IPCacheRow{Identity: 1, Owner: "node"}
	d.IPCache["0.0.0.0/0"] = 2
	d.IPCacheTable["0.0.0.0/0"] = IPCacheRow{Identity: 2, Owner: "world"}
	s.Datapath = d
	return s
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func TestCheckDatapathClean(t *testing.T) {
	s, e := cleanSnapshot()
	if vs := Check(withDatapath(s), e); len(vs) > 0 {
		t.Fatalf("a clean datapath has violations: %v", vs)
	}
}

// TestCheckDatapathFindsFaults plants one datapath fault at a time.
func TestCheckDatapathFindsFaults(t *testing.T) {
	const a, b = "10.0.0.10", "10.0.0.11" // pods a (endpoint 10) and b (11)
	tests := []struct {
		name  string
		plant func(d *Datapath)
		want  string
	}{
		{"lxc entry the table does not have", func(d *Datapath) { d.LXC["10.0.0.70"] = LXCEntry{ID: 70} }, "bpf-lxc-table"},
		{"lxc entry differs from its row", func(d *Datapath) { d.LXC[a] = LXCEntry{ID: 10, Identity: 9, IfIndex: 100} }, "bpf-lxc-table"},
		{"ipcache entry missing from the map", func(d *Datapath) { delete(d.IPCache, "0.0.0.0/0") }, "bpf-ipcache-table"},
		{"ipcache identity differs from its row", func(d *Datapath) { d.IPCache[b+"/32"] = 1001 }, "bpf-ipcache-table"},
		{"endpoint not in cellium_lxc", func(d *Datapath) { delete(d.LXC, a); delete(d.LXCTable, a) }, "bpf-lxc-missing"},
		{"address delivered to another endpoint", func(d *Datapath) {
			d.LXC[a] = LXCEntry{ID: 11, Identity: 1001, IfIndex: 100}
			d.LXCTable[a] = d.LXC[a]
		}, "bpf-lxc-id"},
		{"stale identity in cellium_lxc (relabel missed)", func(d *Datapath) {
			d.LXC[b] = LXCEntry{ID: 11, Identity: 1001, IfIndex: 101}
			d.LXCTable[b] = d.LXC[b]
		}, "bpf-lxc-identity"},
		{"stale identity in cellium_ipcache", func(d *Datapath) {
			d.IPCache[b+"/32"] = 1001
			d.IPCacheTable[b+"/32"] = IPCacheRow{Identity: 1001, Owner: "endpoint 11"}
		}, "bpf-ipcache-identity"},
		{"endpoint not in cellium_ipcache", func(d *Datapath) { delete(d.IPCache, a+"/32"); delete(d.IPCacheTable, a+"/32") }, "bpf-ipcache-missing"},
		{"policy map not pinned", func(d *Datapath) { delete(d.PolicyMaps, 10) }, "bpf-policy-map-missing"},
		{"no policy computed", func(d *Datapath) { delete(d.Policies, 10) }, "bpf-policy-not-computed"},
		{"policy waiting for a recomputation", func(d *Datapath) { d.Policies[10] = d.Policies[10].WithPending(8) }, "bpf-policy-not-computed"},
		{"policy of another identity (relabel not computed)", func(d *Datapath) {
			r := *d.Policies[11]
			r.Identity = 1999
			d.Policies[11] = &r
		}, "bpf-policy-identity"},
		{"policy map lacks an allow", func(d *Datapath) { delete(d.PolicyContent[10], policy.NewKey(1001, policy.Ingress, 6, 80, 16)) }, "bpf-policy-map-content"},
		{"policy map has an extra allow", func(d *Datapath) { d.PolicyContent[10][policy.NewKey(1003, policy.Ingress, 0, 0, 0)] = false }, "bpf-policy-map-content"},
		{"policy map allows what the policy denies", func(d *Datapath) { d.PolicyContent[11][policy.NewKey(1002, policy.Ingress, 0, 0, 0)] = false }, "bpf-policy-map-content"},
		{"policy map unreadable", func(d *Datapath) { delete(d.PolicyContent, 10) }, "bpf-policy-map-content"},
		{"program link gone", func(d *Datapath) { delete(d.Links[10], "cil_to_container") }, "bpf-prog-detached"},
		{"program on another veth", func(d *Datapath) { d.Links[11]["cil_from_container"] = 100 }, "bpf-prog-detached"},
		{"pin that is no attached link", func(d *Datapath) { d.Links[11]["cil_from_container"] = 0 }, "bpf-prog-detached"},
		{"lxc entry of a deleted pod", func(d *Datapath) {
			d.LXC["10.0.0.50"] = LXCEntry{ID: 50}
			d.LXCTable["10.0.0.50"] = d.LXC["10.0.0.50"]
		}, "bpf-lxc-stale"},
		{"ipcache row of a deleted endpoint", func(d *Datapath) {
			d.IPCache["10.0.0.50/32"] = 1001
			d.IPCacheTable["10.0.0.50/32"] = IPCacheRow{Identity: 1001, Owner: "endpoint 50"}
		}, "bpf-ipcache-stale"},
		{"ipcache row of a deleted pod's CEP", func(d *Datapath) {
			d.IPCache["10.0.0.50/32"] = 1001
			d.IPCacheTable["10.0.0.50/32"] = IPCacheRow{Identity: 1001, Owner: "cep " + testNS + "/gone"}
		}, "bpf-ipcache-stale"},
		{"policy map of a deleted endpoint", func(d *Datapath) { d.PolicyMaps[50] = true }, "bpf-policy-map-stale"},
		{"links of a deleted endpoint", func(d *Datapath) { d.Links[50] = map[string]uint32{"cil_to_container": 150} }, "bpf-link-stale"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, e := cleanSnapshot()
			withDatapath(s)
			tt.plant(s.Datapath)
			var got []string
			for _, v := range Check(s, e) {
				got = append(got, v.Invariant)
			}
			if !slices.Contains(got, tt.want) {
				t.Fatalf("want a %s violation, got %v", tt.want, got)
			}
		})
	}
}

// TestCheckDatapathFollowsEndpoints: the datapath of an endpoint that
// checkEndpoints already flags (not ready) is not judged, and a snapshot
// without datapath has no datapath violations.
func TestCheckDatapathFollowsEndpoints(t *testing.T) {
	s, e := cleanSnapshot()
	withDatapath(s)
	endpointOf(s, "a").Status.State = "regenerating"
	delete(s.Datapath.PolicyMaps, 10)
	for _, v := range Check(s, e) {
		if strings.HasPrefix(v.Invariant, "bpf-") {
			t.Errorf("datapath violation for an endpoint that is not ready: %v", v)
		}
	}
	s, e = cleanSnapshot()
	if vs := Check(s, e); len(vs) > 0 {
		t.Fatalf("no datapath, violations: %v", vs)
	}
}

func TestAllowedByPolicy(t *testing.T) {
	web := map[string]string{"app": "web"}
	front := map[string]string{"app": "web", "tier": "front"}
	db := map[string]string{"app": "db"}
	batch := map[string]string{"app": "batch"}
	pinned := map[string]string{"app": "db", "soak": "pinned"}
	tests := []struct {
		src, dst map[string]string
		want     bool
	}{
		{web, db, true}, {front, db, true}, {web, pinned, true},
		{batch, db, false}, {db, db, false}, {batch, pinned, false},
		{batch, web, true}, {db, batch, true},
	}
	for _, tt := range tests {
		if got := allowedByPolicy(tt.src, tt.dst); got != tt.want {
			t.Errorf("allowedByPolicy(%v -> %v) = %v, want %v", tt.src, tt.dst, got, tt.want)
		}
	}
	// The policy object selects and allows the same labels.
	p := soakPolicy(testNS)
	if sel := p.Spec.EndpointSelector.MatchLabels; sel[guardedLabel] != guardedValue {
		t.Errorf("policy selects %v", sel)
	}
	if from := p.Spec.Ingress[0].FromEndpoints[0].MatchLabels; from[guardedLabel] != allowedValue {
		t.Errorf("policy allows from %v", from)
	}
	if pinnedLabels[pinnedServer][guardedLabel] != guardedValue || !allowedByPolicy(pinnedLabels[pinnedClient], pinnedLabels[pinnedServer]) {
		t.Error("the pinned connection must be guarded by the policy and allowed by it")
	}
}

func TestProbeViolation(t *testing.T) {
	p := probe{src: "p-1", dst: "p-2", want: false, tries: 3}
	if v := probeViolation(p); v.Invariant != "policy-leak" {
		t.Errorf("a denied probe that passed: %v", v)
	}
	p.want = true
	if v := probeViolation(p); v.Invariant != "policy-blocked" {
		t.Errorf("an allowed probe that failed: %v", v)
	}
}

// TestPickProbes: the pinned pair is probed (allowed), a denied probe is
// included when a guarded pod and a pod that is not app=web are there,
// the verdicts follow the soak's labels and no pod probes itself.
func TestPickProbes(t *testing.T) {
	s := &Soak{rng: rand.New(rand.NewPCG(1, 2)), alive: map[string]podState{
		pinnedServer: {labels: pinnedLabels[pinnedServer]},
		pinnedClient: {labels: pinnedLabels[pinnedClient]},
		"p-1":        {labels: map[string]string{"app": "batch"}},
		"p-2":        {labels: map[string]string{"app": "web", "tier": "front"}},
	}}
	sbs := map[string]devkubelet.Sandbox{}
	for i, n := range []string{pinnedServer, pinnedClient, "p-1", "p-2"} {
		sbs[n] = devkubelet.Sandbox{Name: n, IP: "10.0.0." + strconv.Itoa(10+i), NetnsPath: "/run/netns/" + n}
	}
	for range 20 {
		ps := s.pickProbes(sbs)
		if len(ps) < 2 || ps[0].src != pinnedClient || ps[0].dst != pinnedServer || !ps[0].want {
			t.Fatalf("first probe %v, want the pinned pair, allowed", ps)
		}
		if ps[1].dst != pinnedServer || ps[1].want || ps[1].srcLbl["app"] == "web" {
			t.Fatalf("second probe %v, want a denied one to the guarded pod", ps[1])
		}
		for _, p := range ps {
			if p.src == p.dst {
				t.Fatalf("a pod probes itself: %v", p)
			}
			if p.want != allowedByPolicy(s.alive[p.src].labels, s.alive[p.dst].labels) || p.srcNS != sbs[p.src].NetnsPath {
				t.Fatalf("probe %v does not follow the labels or the sandbox", p)
			}
		}
	}
}
