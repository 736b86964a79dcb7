package lbsync

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"testing"

	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"

	dpmaps "github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/statedb/lb"
	"github.com/cellium/cellium/statedb/nodes"
	"github.com/cellium/cellium/statedb/reconciler"
)

// fakeRanges is cellium_lb4_source_range in memory beside a fakeLB. Its
// writes go into the fakeLB's log ("range+ P", "range- P"); a delete that
// leaves a frontend whose external slot 0 is flagged without any prefix
// is recorded in violations.
type fakeRanges struct {
	f          *fakeLB
	ranges     map[dpmaps.SourceRange]bool
	violations *[]string
}

func newFakeRanges(f *fakeLB) fakeRanges {
	return fakeRanges{f: f, ranges: map[dpmaps.SourceRange]bool{}, violations: new([]string)}
}

func (r fakeRanges) Update(keys []dpmaps.SourceRange) error {
	r.f.mu.Lock()
	defer r.f.mu.Unlock()
	for _, k := range keys {
		r.ranges[k] = true
		r.f.log = append(r.f.log, "range+ "+k.Prefix.String())
	}
	return nil
}

func (r fakeRanges) Delete(keys []dpmaps.SourceRange) error {
	r.f.mu.Lock()
	defer r.f.mu.Unlock()
	for _, k := range keys {
		delete(r.ranges, k)
		r.f.log = append(r.f.log, "range- "+k.Prefix.String())
		if r.flaggedWithout(k.Frontend) {
			*r.violations = append(*r.violations, fmt.Sprintf("%v flagged without prefixes after deleting %v", k.Frontend, k.Prefix))
		}
	}
	return nil
}

func (r fakeRanges) Dump() ([]dpmaps.SourceRange, error) {
	r.f.mu.Lock()
	defer r.f.mu.Unlock()
	var out []dpmaps.SourceRange
	for k := range r.ranges {
		out = append(out, k)
	}
	return out, nil
}

// flaggedWithout reports whether fe's external slot 0 is flagged
// LB4_SVC_SOURCE_RANGE while the map has no prefix of fe (under f.mu).
func (r fakeRanges) flaggedWithout(fe lb.L4Addr) bool {
	v, ok := r.f.services[dpmaps.ServiceSlot{Frontend: fe, Scope: dpmaps.ScopeExt}]
	if !ok || !v.SourceRange {
		return false
	}
	for k := range r.ranges {
		if k.Frontend == fe {
			return false
		}
	}
	return true
}

// checkedServices is fakeServices recording a slot 0 flagged before the
// frontend has prefixes, and logging the flag ("count N src").
type checkedServices struct {
	fakeServices
	r fakeRanges
}

func (s checkedServices) Update(keys []dpmaps.ServiceSlot, vals []dpmaps.ServiceValue) error {
	if err := s.fakeServices.Update(keys, vals); err != nil {
		return err
	}
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	for i, k := range keys {
		if k.Slot == 0 && k.Scope == dpmaps.ScopeExt && vals[i].SourceRange {
			s.f.log[len(s.f.log)-len(keys)+i] += " src"
			if s.r.flaggedWithout(k.Frontend) {
				*s.r.violations = append(*s.r.violations, fmt.Sprintf("%v flagged before its prefixes", k.Frontend))
			}
		}
	}
	return nil
}

func prefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

// srcRangeSetup is a FrontendOps with a source range map and one backend
// (ID 1) in the table and the map.
func srcRangeSetup(t *testing.T) (*fakeLB, fakeRanges, *FrontendOps, statedb.ReadTxn, lb.L4Addr) {
	tt := newTables(t)
	f := newFakeLB()
	r := newFakeRanges(f)
	be := lb.L4Addr{Addr: mustAddr("10.0.0.1"), Port: 8080, Proto: lb.TCP}
	wtxn := tt.DB.WriteTxn(tt.Backends)
	_, _, _ = tt.Backends.Insert(wtxn, &lb.Backend{Address: be, ID: 1, Status: reconciler.Done()})
	f.backends[1] = be
	txn := wtxn.Commit()
	ops := NewFrontendOps(checkedServices{fakeServices{f}, r}, fakeMatch{f}, tt.Backends).WithSourceRanges(r)
	return f, r, ops, txn, lb.L4Addr{Addr: mustAddr("192.0.2.10"), Port: 80, Proto: lb.TCP}
}

func srcRow(fe lb.L4Addr, ranges ...string) *lb.Frontend {
	return &lb.Frontend{Address: fe, Type: lb.TypeLoadBalancer, Service: "ns/s",
		Backends: []lb.L4Addr{{Addr: mustAddr("10.0.0.1"), Port: 8080, Proto: lb.TCP}}, BackendIDs: []uint32{1},
		SourceRanges: prefixes(ranges...)}
}

// A frontend's source ranges are written before its slot 0 carries
// LB4_SVC_SOURCE_RANGE, prefixes it loses are deleted after slot 0 is
// rewritten, clearing the ranges clears the flag before the prefixes go,
// and Delete removes slot 0 before the prefixes: no program ever sees the
// flag without the frontend's prefixes.
func TestFrontendOpsSourceRangeOrder(t *testing.T) {
	f, r, ops, txn, fe := srcRangeSetup(t)
	ctx := context.Background()
	step := func(name string, row *lb.Frontend, want []string) {
		t.Helper()
		f.log = nil
		if err := ops.Update(ctx, txn, row); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got := slices.DeleteFunc(f.log, func(s string) bool { return s[:5] == "match" }); !slices.Equal(got, want) {
			t.Errorf("%s: writes %q, want %q", name, got, want)
		}
	}
	step("ranges set", srcRow(fe, "10.0.0.0/8", "192.168.0.0/16"),
		[]string{"range+ 10.0.0.0/8", "range+ 192.168.0.0/16", "slot 1=1", "count 1 src"})
	step("ranges changed", srcRow(fe, "192.168.0.0/16", "172.16.0.0/12"),
		[]string{"range+ 172.16.0.0/12", "slot 1=1", "count 1 src", "range- 10.0.0.0/8"})
	if v := f.services[dpmaps.ServiceSlot{Frontend: fe}]; !v.SourceRange || !v.NodePort {
		t.Errorf("slot 0 %+v, want nodeport and source-range", v)
	}
	step("ranges cleared", srcRow(fe), []string{"slot 1=1", "count 1", "range- 192.168.0.0/16", "range- 172.16.0.0/12"})
	if v := f.services[dpmaps.ServiceSlot{Frontend: fe}]; v.SourceRange {
		t.Errorf("slot 0 %+v still flagged", v)
	}
	if len(r.ranges) != 0 {
		t.Errorf("prefixes left: %v", r.ranges)
	}
	step("ranges again", srcRow(fe, "10.1.0.0/16"), []string{"range+ 10.1.0.0/16", "slot 1=1", "count 1 src"})
	if err := ops.Delete(ctx, txn, srcRow(fe, "10.1.0.0/16")); err != nil {
		t.Fatal(err)
	}
	if len(r.ranges) != 0 || len(f.services) != 0 {
		t.Errorf("after delete: prefixes %v, services %v", r.ranges, f.services)
	}
	if len(*r.violations) > 0 {
		t.Errorf("flag without prefixes: %q", *r.violations)
	}
}

// A restarted agent's FrontendOps learns the map's prefixes at its first
// write: a prefix the frontend no longer has (changed while the agent was
// down) goes after slot 0 is rewritten. Prune deletes the prefixes no row
// has, but keeps those of a slot 0 still flagged (its row, pending,
// clears the flag first); without a source range map no slot 0 is
// flagged.
func TestFrontendOpsSourceRangeRestartAndPrune(t *testing.T) {
	f, r, ops, txn, fe := srcRangeSetup(t)
	ctx := context.Background()
	gone := lb.L4Addr{Addr: mustAddr("192.0.2.11"), Port: 80, Proto: lb.TCP}
	flagged := lb.L4Addr{Addr: mustAddr("192.0.2.12"), Port: 80, Proto: lb.TCP}
	for _, k := range []dpmaps.SourceRange{
		{Frontend: fe, Prefix: netip.MustParsePrefix("10.9.0.0/16")},
		{Frontend: gone, Prefix: netip.MustParsePrefix("10.0.0.0/8")},
		{Frontend: flagged, Prefix: netip.MustParsePrefix("10.2.0.0/16")},
	} {
		r.ranges[k] = true
	}
	f.services[dpmaps.ServiceSlot{Frontend: flagged}] = dpmaps.ServiceValue{NodePort: true, SourceRange: true}
	if err := ops.Update(ctx, txn, srcRow(fe, "10.1.0.0/16")); err != nil {
		t.Fatal(err)
	}
	if !r.ranges[dpmaps.SourceRange{Frontend: fe, Prefix: netip.MustParsePrefix("10.1.0.0/16")}] ||
		r.ranges[dpmaps.SourceRange{Frontend: fe, Prefix: netip.MustParsePrefix("10.9.0.0/16")}] {
		t.Errorf("after the first write: %v, want 10.1.0.0/16 only for %v", r.ranges, fe)
	}
	// Desired: fe with its range, flagged's row without ranges (pending).
	desired := func(yield func(*lb.Frontend, statedb.Revision) bool) {
		_ = yield(srcRow(fe, "10.1.0.0/16"), 1) && yield(srcRow(flagged), 2)
	}
	if err := ops.Prune(ctx, txn, desired); err != nil {
		t.Fatal(err)
	}
	want := map[dpmaps.SourceRange]bool{
		{Frontend: fe, Prefix: netip.MustParsePrefix("10.1.0.0/16")}:      true,
		{Frontend: flagged, Prefix: netip.MustParsePrefix("10.2.0.0/16")}: true,
	}
	if !maps.Equal(r.ranges, want) {
		t.Errorf("after prune: %v, want %v", r.ranges, want)
	}
	// flagged's Update clears the flag, then its prefix goes.
	if err := ops.Update(ctx, txn, srcRow(flagged)); err != nil {
		t.Fatal(err)
	}
	if r.ranges[dpmaps.SourceRange{Frontend: flagged, Prefix: netip.MustParsePrefix("10.2.0.0/16")}] {
		t.Errorf("%v's prefix left after its update without ranges", flagged)
	}
	if len(*r.violations) > 0 {
		t.Errorf("flag without prefixes: %q", *r.violations)
	}

	// Without a source range map: no flag.
	plain := NewFrontendOps(fakeServices{f}, fakeMatch{f}, ops.backends)
	other := lb.L4Addr{Addr: mustAddr("192.0.2.13"), Port: 80, Proto: lb.TCP}
	if err := plain.Update(ctx, txn, srcRow(other, "10.0.0.0/8")); err != nil {
		t.Fatal(err)
	}
	if v := f.services[dpmaps.ServiceSlot{Frontend: other}]; v.SourceRange {
		t.Errorf("slot 0 flagged without a source range map: %+v", v)
	}
}

// The deriver gives a LoadBalancer Service's frontends its
// loadBalancerSourceRanges with Tables.SourceRangeCheck (its LoadBalancer
// frontend, not the ClusterIP or NodePort), none without; a change of the
// ranges alone rewrites the frontend.
func TestDeriverSourceRanges(t *testing.T) {
	for _, check := range []bool{true, false} {
		tt := newTables(t)
		local, err := nodes.NewLocalNodeTable(tt.DB)
		if err != nil {
			t.Fatal(err)
		}
		tt.KubeProxyReplacement, tt.NodeName, tt.LocalNode, tt.SourceRangeCheck = true, "node1", local, check
		d := NewDeriver(tt.Tables, nil)
		if err := d.Subscribe(); err != nil {
			t.Fatal(err)
		}
		svc := service(1, "http TCP 80")
		svc.Spec.Type = corev1.ServiceTypeLoadBalancer
		svc.Spec.Ports[0].NodePort = 30080
		svc.Spec.LoadBalancerSourceRanges = []string{"10.0.0.0/8"}
		svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "172.16.0.10"}}
		ranges := func() map[string]string {
			out := map[string]string{}
			for f := range tt.Frontends.All(tt.DB.ReadTxn()) {
				out[f.Address.String()] = fmt.Sprint(f.SourceRanges)
			}
			return out
		}
		for i, rs := range [][]string{{"10.0.0.0/8"}, {"10.0.0.0/8", "192.0.2.0/24"}} {
			svc = svc.DeepCopy()
			svc.Spec.LoadBalancerSourceRanges = rs
			wtxn := tt.DB.WriteTxn(tt.svcs, local)
			_, _, _ = tt.svcs.Insert(wtxn, svc)
			_, _, _ = local.Insert(wtxn, &nodes.LocalNode{Name: "node1",
				NodeAddresses: []nodes.Address{{Type: nodes.AddressInternalIP, IP: mustAddr("192.168.56.11")}}})
			wtxn.Commit()
			if _, _, _, err := d.Step(); err != nil {
				t.Fatal(err)
			}
			want := map[string]string{"10.96.0.1:80/TCP": "[]", "0.0.0.0:30080/TCP": "[]",
				"192.168.56.11:30080/TCP": "[]", "172.16.0.10:80/TCP": "[]"}
			if check {
				want["172.16.0.10:80/TCP"] = fmt.Sprint(prefixes(rs...))
			}
			if got := ranges(); !maps.Equal(got, want) {
				t.Errorf("check %v, step %d: ranges %v, want %v", check, i, got, want)
			}
		}
		d.close()
	}
}
