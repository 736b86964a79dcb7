package k8s

import (
	"slices"
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

// slimIdentity returns a copy of a CiliumIdentity without its managed
// fields and with the strings of its labels shared with every other
// identity's (the keys repeat in all of them, the values in many); c is
// not changed.
func slimIdentity(c *ciliumv2.CiliumIdentity) *ciliumv2.CiliumIdentity {
	out := *c
	out.ManagedFields = nil
	out.SecurityLabels = internMap(c.SecurityLabels)
	out.Labels = internMap(c.Labels)
	return &out
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
