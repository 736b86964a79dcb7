package cesbatcher

import (
	"cmp"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/equality"
	utilrand "k8s.io/apimachinery/pkg/util/rand"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/cilium.io/v2alpha1"
)

// group is what endpoints sharing a slice have in common.
type group struct {
	ns string
	id int64
}

// slice is a desired slice.
type slice struct {
	name string
	group
	// eps are the entries by endpoint name.
	eps map[string]v2alpha1.CoreCiliumEndpoint
}

// Batcher assigns CiliumEndpoints to slices. It keeps its assignment
// between calls to Plan, so that an endpoint stays in its slice while it
// keeps its namespace and identity. Not safe for concurrent use.
type Batcher struct {
	max     int
	newName func() string

	slices map[string]*slice
	groups map[group]map[string]struct{}
	// assign is the slice of each endpoint ("namespace/name").
	assign  map[string]string
	adopted bool
}

// NewBatcher returns a batcher that puts at most max entries in a slice.
// newName (nil: NewSliceName) names new slices.
func NewBatcher(max int, newName func() string) *Batcher {
	if newName == nil {
		newName = NewSliceName
	}
	return &Batcher{max: max, newName: newName, slices: map[string]*slice{},
		groups: map[group]map[string]struct{}{}, assign: map[string]string{}}
}

// NewSliceName returns a fresh slice name in Cilium's form:
// "ces-" and two random parts.
func NewSliceName() string {
	return "ces-" + utilrand.String(9) + "-" + utilrand.String(5)
}

// Plan brings the desired slices up to date with ceps, every
// CiliumEndpoint of the cluster now. The first call adopts the entries
// of existing (the slices in the cluster) that still match their
// endpoint's namespace and identity, up to the size limit.
func (b *Batcher) Plan(ceps []*ciliumv2.CiliumEndpoint, existing []*v2alpha1.CiliumEndpointSlice) {
	now := make(map[string]*ciliumv2.CiliumEndpoint, len(ceps))
	for _, c := range ceps {
		now[c.Namespace+"/"+c.Name] = c
	}
	if !b.adopted {
		b.adopted = true
		b.adopt(now, existing)
	}
	// Endpoints gone or regrouped leave their slice; the others get
	// their entry refreshed.
	for key, name := range b.assign {
		s := b.slices[name]
		c, ok := now[key]
		if !ok || groupOf(c) != s.group {
			b.remove(key)
			continue
		}
		s.eps[c.Name] = v2alpha1.CoreFromCiliumEndpoint(c)
	}
	// The endpoints without a slice, in a stable order.
	var unplaced []string
	for key := range now {
		if _, ok := b.assign[key]; !ok {
			unplaced = append(unplaced, key)
		}
	}
	slices.Sort(unplaced)
	for _, key := range unplaced {
		b.place(now[key])
	}
}

// adopt takes over the existing slices' entries that fit.
func (b *Batcher) adopt(now map[string]*ciliumv2.CiliumEndpoint, existing []*v2alpha1.CiliumEndpointSlice) {
	sorted := slices.Clone(existing)
	slices.SortFunc(sorted, func(x, y *v2alpha1.CiliumEndpointSlice) int { return cmp.Compare(x.Name, y.Name) })
	for _, ces := range sorted {
		if _, taken := b.slices[ces.Name]; taken {
			continue
		}
		var s *slice
		for i := range ces.Endpoints {
			key := ces.Namespace + "/" + ces.Endpoints[i].Name
			c, ok := now[key]
			if _, done := b.assign[key]; !ok || done {
				continue
			}
			g := groupOf(c)
			if s == nil {
				s = &slice{name: ces.Name, group: g, eps: map[string]v2alpha1.CoreCiliumEndpoint{}}
			}
			if g != s.group || len(s.eps) >= b.max {
				continue
			}
			s.eps[c.Name] = v2alpha1.CoreFromCiliumEndpoint(c)
			b.assign[key] = s.name
		}
		if s != nil && len(s.eps) > 0 {
			b.add(s)
		}
	}
}

// place puts an endpoint into the fullest slice of its group with room,
// or a new one.
func (b *Batcher) place(c *ciliumv2.CiliumEndpoint) {
	g := groupOf(c)
	var best *slice
	for name := range b.groups[g] {
		s := b.slices[name]
		if len(s.eps) >= b.max {
			continue
		}
		if best == nil || len(s.eps) > len(best.eps) || (len(s.eps) == len(best.eps) && s.name < best.name) {
			best = s
		}
	}
	if best == nil {
		name := b.newName()
		for b.slices[name] != nil {
			name = b.newName()
		}
		best = &slice{name: name, group: g, eps: map[string]v2alpha1.CoreCiliumEndpoint{}}
		b.add(best)
	}
	best.eps[c.Name] = v2alpha1.CoreFromCiliumEndpoint(c)
	b.assign[c.Namespace+"/"+c.Name] = best.name
}

func (b *Batcher) add(s *slice) {
	b.slices[s.name] = s
	if b.groups[s.group] == nil {
		b.groups[s.group] = map[string]struct{}{}
	}
	b.groups[s.group][s.name] = struct{}{}
}

// remove takes an endpoint out of its slice, and drops the slice if that
// leaves it empty.
func (b *Batcher) remove(key string) {
	name := b.assign[key]
	delete(b.assign, key)
	s := b.slices[name]
	if s == nil {
		return
	}
	// The slice holds only its namespace's endpoints, by name.
	delete(s.eps, strings.TrimPrefix(key, s.ns+"/"))
	if len(s.eps) == 0 {
		delete(b.slices, name)
		delete(b.groups[s.group], name)
		if len(b.groups[s.group]) == 0 {
			delete(b.groups, s.group)
		}
	}
}

// Rename gives the slice name a new name (its create found the name
// taken by someone else's object).
func (b *Batcher) Rename(name string) {
	s := b.slices[name]
	if s == nil {
		return
	}
	delete(b.slices, name)
	delete(b.groups[s.group], name)
	s.name = b.newName()
	for b.slices[s.name] != nil || s.name == name {
		s.name = b.newName()
	}
	b.add(s)
	for n := range s.eps {
		b.assign[s.ns+"/"+n] = s.name
	}
}

// Desired returns the desired slices by name, each with its entries
// sorted by name.
func (b *Batcher) Desired() map[string]*v2alpha1.CiliumEndpointSlice {
	out := make(map[string]*v2alpha1.CiliumEndpointSlice, len(b.slices))
	for name, s := range b.slices {
		out[name] = s.object()
	}
	return out
}

func (s *slice) object() *v2alpha1.CiliumEndpointSlice {
	ces := &v2alpha1.CiliumEndpointSlice{Namespace: s.ns, Endpoints: make([]v2alpha1.CoreCiliumEndpoint, 0, len(s.eps))}
	ces.Name = s.name
	for _, e := range s.eps {
		ces.Endpoints = append(ces.Endpoints, e)
	}
	sortEntries(ces.Endpoints)
	return ces
}

func sortEntries(eps []v2alpha1.CoreCiliumEndpoint) {
	slices.SortFunc(eps, func(x, y v2alpha1.CoreCiliumEndpoint) int { return cmp.Compare(x.Name, y.Name) })
}

// groupOf is the slice group of an endpoint: its namespace and identity
// (0 while it has none).
func groupOf(c *ciliumv2.CiliumEndpoint) group {
	g := group{ns: c.Namespace}
	if c.Status.Identity != nil {
		g.id = c.Status.Identity.ID
	}
	return g
}

// SameContent reports whether two slices hold the same namespace and
// entries, in any order.
func SameContent(a, b *v2alpha1.CiliumEndpointSlice) bool {
	if a.Namespace != b.Namespace || len(a.Endpoints) != len(b.Endpoints) {
		return false
	}
	x, y := slices.Clone(a.Endpoints), slices.Clone(b.Endpoints)
	sortEntries(x)
	sortEntries(y)
	return equality.Semantic.DeepEqual(x, y)
}
