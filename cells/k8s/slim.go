package k8s

import (
	"maps"
	"slices"
	"strings"
	"unique"
	"weak"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
)

// cepSlimmer makes the CiliumEndpoints the agent keeps (one per pod of
// the cluster) smaller without changing a field's value: it drops the
// managed fields (server-side apply's bookkeeping, which nobody in the
// agent reads), shares one EndpointIdentity among the CEPs whose
// identities are equal (the pods of a Deployment: the labels are most of
// a remote CEP), and shares the strings many CEPs repeat (namespace,
// service account, state). Rows are never modified in place, so sharing
// is safe. Only the reflector's goroutine uses it.
type cepSlimmer struct {
	// ids are the identities handed out, by number; weak, so that an
	// identity no CEP uses any more is freed (and its entry swept).
	ids     map[int64]weak.Pointer[ciliumv2.EndpointIdentity]
	sweepAt int
}

func newCEPSlimmer() *cepSlimmer {
	return &cepSlimmer{ids: map[int64]weak.Pointer[ciliumv2.EndpointIdentity]{}, sweepAt: 1024}
}

// slim returns a copy of c that shares what it can; c is not changed
// (the reflector's object may be shared with its source: a fake
// clientset's tracker keeps the objects its watch hands out).
func (s *cepSlimmer) slim(c *ciliumv2.CiliumEndpoint) *ciliumv2.CiliumEndpoint {
	out := *c
	out.ManagedFields = nil
	out.Namespace = intern(c.Namespace)
	out.Status.ServiceAccount = intern(c.Status.ServiceAccount)
	out.Status.State = ciliumv2.EndpointState(intern(string(c.Status.State)))
	if c.Status.Identity != nil {
		out.Status.Identity = s.identity(c.Status.Identity)
	}
	return &out
}

// identity returns the shared identity equal to id (id itself the first
// time).
func (s *cepSlimmer) identity(id *ciliumv2.EndpointIdentity) *ciliumv2.EndpointIdentity {
	if w, ok := s.ids[id.ID]; ok {
		if p := w.Value(); p != nil && (p.Labels == nil) == (id.Labels == nil) && slices.Equal(p.Labels, id.Labels) {
			return p
		}
	}
	shared := &ciliumv2.EndpointIdentity{ID: id.ID}
	if id.Labels != nil {
		shared.Labels = make([]string, len(id.Labels))
		for i, l := range id.Labels {
			shared.Labels[i] = intern(l)
		}
	}
	s.ids[id.ID] = weak.Make(shared)
	if len(s.ids) > s.sweepAt {
		for n, w := range s.ids {
			if w.Value() == nil {
				delete(s.ids, n)
			}
		}
		s.sweepAt = max(1024, 2*len(s.ids))
	}
	return shared
}

// intern returns the canonical copy of a string.
func intern(v string) string {
	if v == "" {
		return ""
	}
	return unique.Make(v).Value()
}

// identitySlimmer makes the CiliumIdentities the agent keeps smaller
// without changing a field's value: no managed fields, the strings of the
// security labels shared with every other identity's (the keys repeat in
// all of them, the values in many), and one metadata labels map shared
// by the identities whose maps are equal (the allocator labels each with
// its namespace only). Only the reflector's goroutine uses it.
type identitySlimmer struct {
	// maps are the shared metadata label maps by their content; reset
	// when it grows past maxSharedMaps (rows keep the maps they have).
	maps map[string]map[string]string
}

const maxSharedMaps = 4096

func newIdentitySlimmer() *identitySlimmer {
	return &identitySlimmer{maps: map[string]map[string]string{}}
}

// slim returns a copy of c; c is not changed.
func (s *identitySlimmer) slim(c *ciliumv2.CiliumIdentity) *ciliumv2.CiliumIdentity {
	out := *c
	out.ManagedFields = nil
	out.SecurityLabels = internMap(c.SecurityLabels)
	out.Labels = s.shared(c.Labels)
	return &out
}

// shared returns the shared map equal to m (a copy of m the first time).
func (s *identitySlimmer) shared(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	keys := slices.Sorted(maps.Keys(m))
	var b strings.Builder
	for _, k := range keys {
		// NUL cannot occur in a label key or value.
		b.WriteString(k)
		b.WriteByte(0)
		b.WriteString(m[k])
		b.WriteByte(0)
	}
	if got, ok := s.maps[b.String()]; ok {
		return got
	}
	if len(s.maps) >= maxSharedMaps {
		clear(s.maps)
	}
	out := internMap(m)
	s.maps[b.String()] = out
	return out
}

// internMap returns a copy of m with interned keys and values.
func internMap(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[intern(k)] = intern(v)
	}
	return out
}
