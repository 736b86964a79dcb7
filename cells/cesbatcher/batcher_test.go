package cesbatcher

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/cilium.io/v2alpha1"
)

// cep is a CiliumEndpoint of namespace ns with identity id (0: none) at
// address ip on node 192.0.2.1.
func cep(ns, name string, id int64, ip string) *ciliumv2.CiliumEndpoint {
	c := &ciliumv2.CiliumEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: name, UID: types.UID("uid-" + name)}}}}
	if id != 0 {
		c.Status.Identity = &ciliumv2.EndpointIdentity{ID: id}
	}
	c.Status.Networking = &ciliumv2.EndpointNetworking{NodeIP: "192.0.2.1",
		Addressing: ciliumv2.AddressPairList{{IPV4: ip}}}
	return c
}

// counter names slices ces-1, ces-2, ...
func counter() func() string {
	n := 0
	return func() string { n++; return fmt.Sprintf("ces-%d", n) }
}

// layout is the desired slices as "name ns id: ep,ep" lines, sorted.
func layout(b *Batcher) []string {
	var out []string
	for name, ces := range b.Desired() {
		var eps []string
		id := int64(-1)
		for _, e := range ces.Endpoints {
			eps = append(eps, e.Name)
			if id != -1 && e.IdentityID != id {
				eps = append(eps, "MIXED")
			}
			id = e.IdentityID
		}
		out = append(out, fmt.Sprintf("%s %s %d: %s", name, ces.Namespace, id, strings.Join(eps, ",")))
	}
	sort.Strings(out)
	return out
}

// check verifies the invariants: every CEP in exactly one slice of its
// namespace and identity, no slice above max or empty, entries equal to
// their CEP.
func check(t *testing.T, b *Batcher, ceps []*ciliumv2.CiliumEndpoint, max int) {
	t.Helper()
	want := map[string]*ciliumv2.CiliumEndpoint{}
	for _, c := range ceps {
		want[c.Namespace+"/"+c.Name] = c
	}
	seen := map[string]string{}
	for name, ces := range b.Desired() {
		if len(ces.Endpoints) == 0 || len(ces.Endpoints) > max {
			t.Errorf("slice %s has %d entries (max %d)", name, len(ces.Endpoints), max)
		}
		for _, e := range ces.Endpoints {
			key := ces.Namespace + "/" + e.Name
			if prev, dup := seen[key]; dup {
				t.Errorf("%s in slices %s and %s", key, prev, name)
			}
			seen[key] = name
			c, ok := want[key]
			if !ok {
				t.Errorf("slice %s holds %s, which is no CiliumEndpoint", name, key)
				continue
			}
			if got := v2alpha1.CoreFromCiliumEndpoint(c); !SameContent(&v2alpha1.CiliumEndpointSlice{Endpoints: []v2alpha1.CoreCiliumEndpoint{got}},
				&v2alpha1.CiliumEndpointSlice{Endpoints: []v2alpha1.CoreCiliumEndpoint{e}}) {
				t.Errorf("slice %s entry %s = %+v, want %+v", name, key, e, got)
			}
			if e.IdentityID != ces.Endpoints[0].IdentityID {
				t.Errorf("slice %s mixes identities", name)
			}
		}
	}
	for key := range want {
		if _, ok := seen[key]; !ok {
			t.Errorf("%s is in no slice", key)
		}
	}
}

func TestPacking(t *testing.T) {
	b := NewBatcher(100, counter())
	var ceps []*ciliumv2.CiliumEndpoint
	for i := range 250 {
		ceps = append(ceps, cep("a", fmt.Sprintf("p%03d", i), 1000, fmt.Sprintf("10.0.%d.%d", i/200, i%200)))
	}
	ceps = append(ceps, cep("a", "other", 1001, "10.1.0.1"), cep("b", "p000", 1000, "10.2.0.1"), cep("b", "noid", 0, "10.2.0.2"))
	b.Plan(ceps, nil)
	check(t, b, ceps, 100)
	sizes := map[string][]int{}
	for _, ces := range b.Desired() {
		g := fmt.Sprintf("%s/%d", ces.Namespace, ces.Endpoints[0].IdentityID)
		sizes[g] = append(sizes[g], len(ces.Endpoints))
	}
	for _, s := range sizes {
		slices.Sort(s)
	}
	want := map[string][]int{"a/1000": {50, 100, 100}, "a/1001": {1}, "b/1000": {1}, "b/0": {1}}
	if !maps.EqualFunc(sizes, want, slices.Equal[[]int]) {
		t.Errorf("slice sizes %v, want %v", sizes, want)
	}
	// A second plan of the same endpoints changes nothing.
	before := layout(b)
	b.Plan(ceps, nil)
	if after := layout(b); !slices.Equal(before, after) {
		t.Errorf("replanning moved entries:\n%v\n%v", before, after)
	}
}

func TestDeletionAndRefill(t *testing.T) {
	b := NewBatcher(2, counter())
	ceps := []*ciliumv2.CiliumEndpoint{cep("a", "x1", 1000, "10.0.0.1"), cep("a", "x2", 1000, "10.0.0.2"), cep("a", "x3", 1000, "10.0.0.3")}
	b.Plan(ceps, nil)
	if got, want := layout(b), []string{"ces-1 a 1000: x1,x2", "ces-2 a 1000: x3"}; !slices.Equal(got, want) {
		t.Fatalf("layout %v, want %v", got, want)
	}
	// x3 goes: its slice empties and is dropped.
	b.Plan(ceps[:2], nil)
	if got, want := layout(b), []string{"ces-1 a 1000: x1,x2"}; !slices.Equal(got, want) {
		t.Fatalf("after deleting x3: %v, want %v", got, want)
	}
	// x1 goes, x4 comes: it fills the hole in ces-1, no new slice.
	ceps = []*ciliumv2.CiliumEndpoint{ceps[1], cep("a", "x4", 1000, "10.0.0.4")}
	b.Plan(ceps, nil)
	if got, want := layout(b), []string{"ces-1 a 1000: x2,x4"}; !slices.Equal(got, want) {
		t.Fatalf("after replacing x1 by x4: %v, want %v", got, want)
	}
	b.Plan(nil, nil)
	if got := layout(b); len(got) != 0 {
		t.Fatalf("no endpoints left, slices %v", got)
	}
}

func TestIdentityChangeMoves(t *testing.T) {
	b := NewBatcher(10, counter())
	ceps := []*ciliumv2.CiliumEndpoint{cep("a", "x1", 1000, "10.0.0.1"), cep("a", "x2", 1000, "10.0.0.2"), cep("a", "y", 2000, "10.0.0.3")}
	b.Plan(ceps, nil)
	before := b.Desired()
	// x1 is relabelled into y's identity.
	ceps[0] = cep("a", "x1", 2000, "10.0.0.1")
	b.Plan(ceps, nil)
	check(t, b, ceps, 10)
	if got, want := layout(b), []string{"ces-1 a 1000: x2", "ces-2 a 2000: x1,y"}; !slices.Equal(got, want) {
		t.Fatalf("layout %v, want %v", got, want)
	}
	// The slice x1 joins is written before the one it leaves.
	ws := plan(b.Desired(), objects(before))
	if len(ws) != 2 || ws[0].want.Name != "ces-2" || !ws[0].adds || ws[1].want.Name != "ces-1" || ws[1].adds {
		t.Errorf("writes %s, want ces-2 (adds) then ces-1 (removes)", describe(ws))
	}
}

// objects turns desired slices into what the cluster would hold.
func objects(m map[string]*v2alpha1.CiliumEndpointSlice) []*v2alpha1.CiliumEndpointSlice {
	var out []*v2alpha1.CiliumEndpointSlice
	for _, ces := range m {
		out = append(out, ces)
	}
	return out
}

func describe(ws []write) string {
	var s []string
	for _, w := range ws {
		s = append(s, fmt.Sprintf("%d:%s(adds=%v)", w.op, name(w), w.adds))
	}
	return strings.Join(s, " ")
}

func TestAdoption(t *testing.T) {
	ceps := []*ciliumv2.CiliumEndpoint{
		cep("a", "x1", 1000, "10.0.0.1"), cep("a", "x2", 1000, "10.0.0.2"), cep("a", "x3", 1000, "10.0.0.3"),
		cep("a", "y", 2000, "10.0.0.4"), cep("b", "z", 1000, "10.0.0.5"),
	}
	entry := func(c *ciliumv2.CiliumEndpoint) v2alpha1.CoreCiliumEndpoint {
		return v2alpha1.CoreFromCiliumEndpoint(c)
	}
	stale := entry(ceps[1])
	stale.Networking = &ciliumv2.EndpointNetworking{NodeIP: "192.0.2.9", Addressing: ciliumv2.AddressPairList{{IPV4: "10.9.9.9"}}}
	gone := entry(cep("a", "gone", 1000, "10.0.0.9"))
	existing := []*v2alpha1.CiliumEndpointSlice{
		// Kept: x1, and x2 although its entry is stale (rewritten).
		{ObjectMeta: metav1.ObjectMeta{Name: "ces-old-1"}, Namespace: "a", Endpoints: []v2alpha1.CoreCiliumEndpoint{entry(ceps[0]), stale, gone}},
		// x1 twice: the second copy is dropped; y fits (its own identity).
		{ObjectMeta: metav1.ObjectMeta{Name: "ces-old-2"}, Namespace: "a", Endpoints: []v2alpha1.CoreCiliumEndpoint{entry(ceps[0]), entry(ceps[3])}},
		// Nothing of it is current: deleted.
		{ObjectMeta: metav1.ObjectMeta{Name: "ces-old-3"}, Namespace: "a", Endpoints: []v2alpha1.CoreCiliumEndpoint{gone}},
	}
	b := NewBatcher(2, counter())
	b.Plan(ceps, existing)
	check(t, b, ceps, 2)
	want := []string{"ces-1 a 1000: x3", "ces-2 b 1000: z", "ces-old-1 a 1000: x1,x2", "ces-old-2 a 2000: y"}
	if got := layout(b); !slices.Equal(got, want) {
		t.Fatalf("layout %v, want %v", got, want)
	}
	ws := plan(b.Desired(), existing)
	if got, want := describe(ws), "0:ces-1(adds=true) 0:ces-2(adds=true) 1:ces-old-1(adds=true) 1:ces-old-2(adds=false) 2:ces-old-3(adds=false)"; got != want {
		t.Errorf("writes %s, want %s", got, want)
	}
	// After the writes the cluster matches: nothing more to write.
	b.Plan(ceps, objects(b.Desired()))
	if ws := plan(b.Desired(), objects(b.Desired())); len(ws) != 0 {
		t.Errorf("writes after convergence: %s", describe(ws))
	}
}

// TestSliceDisagrees: a slice edited behind the batcher's back (an entry's
// identity changed) is rewritten to what the CiliumEndpoint says.
func TestSliceDisagrees(t *testing.T) {
	b := NewBatcher(10, counter())
	ceps := []*ciliumv2.CiliumEndpoint{cep("a", "x", 1000, "10.0.0.1")}
	b.Plan(ceps, nil)
	cluster := objects(b.Desired())
	edited := cluster[0].DeepCopy()
	edited.Endpoints[0].IdentityID = 666
	b.Plan(ceps, []*v2alpha1.CiliumEndpointSlice{edited})
	ws := plan(b.Desired(), []*v2alpha1.CiliumEndpointSlice{edited})
	if len(ws) != 1 || ws[0].op != opUpdate || ws[0].want.Endpoints[0].IdentityID != 1000 {
		t.Fatalf("writes %s, want one update back to identity 1000", describe(ws))
	}
}

func TestRename(t *testing.T) {
	b := NewBatcher(10, counter())
	b.Plan([]*ciliumv2.CiliumEndpoint{cep("a", "x", 1000, "10.0.0.1")}, nil)
	b.Rename("ces-1")
	if got, want := layout(b), []string{"ces-2 a 1000: x"}; !slices.Equal(got, want) {
		t.Fatalf("layout %v, want %v", got, want)
	}
	b.Plan([]*ciliumv2.CiliumEndpoint{cep("a", "x", 1000, "10.0.0.1"), cep("a", "w", 1000, "10.0.0.2")}, nil)
	if got, want := layout(b), []string{"ces-2 a 1000: w,x"}; !slices.Equal(got, want) {
		t.Fatalf("layout %v, want %v", got, want)
	}
}

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []Config{
		{CESMaxCiliumendpointsPerCES: 0, CESSliceMode: "identity", CESRateLimits: DefaultRateLimits},
		{CESMaxCiliumendpointsPerCES: 100, CESSliceMode: "fcfs", CESRateLimits: DefaultRateLimits},
		{CESMaxCiliumendpointsPerCES: 100, CESSliceMode: "identity", CESRateLimits: `[{"nodes":0,"limit":51,"burst":20}]`},
		{CESMaxCiliumendpointsPerCES: 100, CESSliceMode: "identity", CESRateLimits: DefaultRateLimits, CESWriteQPSLimit: 51, WriteQPSLimitSet: true},
		{CESMaxCiliumendpointsPerCES: 100, CESSliceMode: "identity", CESRateLimits: DefaultRateLimits, CESWriteQPSBurst: 0, WriteQPSBurstSet: true},
	} {
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "--ces-") {
			t.Errorf("%+v: err = %v, want one naming the flag", c, err)
		}
	}
}

func TestNewSliceName(t *testing.T) {
	n := NewSliceName()
	if len(n) != len("ces-")+9+1+5 || !strings.HasPrefix(n, "ces-") {
		t.Errorf("name %q", n)
	}
}
