package policy

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	api "github.com/cellium/cellium/api/policy"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/labels"
)

// Matcher decides whether an identity is selected. Selector (label
// selectors) and CIDRSelector (address blocks) implement it.
type Matcher interface {
	// Matches reports whether the identity id with labels lbls is selected.
	Matches(id identity.NumericIdentity, lbls labels.Labels) bool
	// String is the canonical text of the matcher: two matchers with the
	// same String select the same identities.
	String() string
}

// Operator is the relation of a selector requirement.
type Operator uint8

// The operators, as in Kubernetes label selectors.
const (
	OpIn Operator = iota
	OpNotIn
	OpExists
	OpDoesNotExist
)

func (o Operator) String() string {
	switch o {
	case OpNotIn:
		return "notin"
	case OpExists:
		return "exists"
	case OpDoesNotExist:
		return "!exists"
	}
	return "in"
}

// Requirement is one condition of a Selector on one label.
type Requirement struct {
	// Source of the label; labels.SourceAny matches any source.
	Source string
	// Key of the label.
	Key string
	// Op relates the label to Values.
	Op Operator
	// Values, sorted and unique; only for OpIn and OpNotIn.
	Values []string
}

func (r Requirement) matches(lbls labels.Labels) bool {
	l, ok := lbls.Get(r.Key)
	present := ok && (r.Source == labels.SourceAny || r.Source == l.Source)
	switch r.Op {
	case OpIn:
		return present && slices.Contains(r.Values, l.Value)
	case OpNotIn:
		return !present || !slices.Contains(r.Values, l.Value)
	case OpExists:
		return present
	default:
		return !present
	}
}

func (r Requirement) String() string {
	k := r.Source + ":" + r.Key
	switch r.Op {
	case OpExists:
		return k
	case OpDoesNotExist:
		return "!" + k
	case OpIn:
		if len(r.Values) == 1 {
			return k + "=" + r.Values[0]
		}
	}
	return k + " " + r.Op.String() + " (" + strings.Join(r.Values, ",") + ")"
}

func (r Requirement) compare(o Requirement) int {
	if c := strings.Compare(r.Key, o.Key); c != 0 {
		return c
	}
	if c := strings.Compare(r.Source, o.Source); c != 0 {
		return c
	}
	if r.Op != o.Op {
		return int(r.Op) - int(o.Op)
	}
	return slices.Compare(r.Values, o.Values)
}

// Selector is a compiled label selector: all of its requirements must
// hold. The empty selector selects every identity. A Selector is immutable.
type Selector struct {
	reqs []Requirement // sorted, unique
	str  string
}

// NewSelector builds a selector from requirements (in any order; duplicates
// are dropped).
func NewSelector(reqs ...Requirement) *Selector {
	rs := make([]Requirement, 0, len(reqs))
	for _, r := range reqs {
		if r.Op == OpIn || r.Op == OpNotIn {
			r.Values = slices.Compact(slices.Sorted(slices.Values(r.Values)))
		} else {
			r.Values = nil
		}
		rs = append(rs, r)
	}
	slices.SortFunc(rs, Requirement.compare)
	rs = slices.CompactFunc(rs, func(a, b Requirement) bool { return a.compare(b) == 0 })
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = r.String()
	}
	return &Selector{reqs: rs, str: "{" + strings.Join(parts, ", ") + "}"}
}

// WildcardSelector selects every identity.
func WildcardSelector() *Selector { return NewSelector() }

// With returns a selector with the extra requirements.
func (s *Selector) With(reqs ...Requirement) *Selector {
	return NewSelector(append(slices.Clone(s.reqs), reqs...)...)
}

// Requirements returns the selector's requirements, sorted.
func (s *Selector) Requirements() []Requirement { return slices.Clone(s.reqs) }

// IsWildcard reports whether the selector has no requirement.
func (s *Selector) IsWildcard() bool { return len(s.reqs) == 0 }

// HasKey reports whether a requirement is about the label key (of any
// source).
func (s *Selector) HasKey(key string) bool {
	return slices.ContainsFunc(s.reqs, func(r Requirement) bool { return r.Key == key })
}

// HasSource reports whether a requirement is about a label of the source.
func (s *Selector) HasSource(source string) bool {
	return slices.ContainsFunc(s.reqs, func(r Requirement) bool { return r.Source == source })
}

// Matches reports whether every requirement holds for lbls.
func (s *Selector) Matches(_ identity.NumericIdentity, lbls labels.Labels) bool {
	return s.MatchesLabels(lbls)
}

// MatchesLabels is Matches without the identity.
func (s *Selector) MatchesLabels(lbls labels.Labels) bool {
	for _, r := range s.reqs {
		if !r.matches(lbls) {
			return false
		}
	}
	return true
}

// String prints the selector canonically, e.g. "{k8s:app=web,
// any:tier in (a,b)}".
func (s *Selector) String() string { return s.str }

// parseSelectorKey splits a selector key into source and key: "k8s:app" is
// (k8s, app), "app" is (any, app), "$host" and "reserved.host" are
// (reserved, host).
func parseSelectorKey(k string) (source, key string, err error) {
	l := labels.ParseSelect(k)
	if l.Key == "" || l.Value != "" || l.Source == "" {
		return "", "", fmt.Errorf("selector key %q: want [source:]key", k)
	}
	return l.Source, l.Key, nil
}

// CompileSelector compiles a rule's label selector. A nil selector gives
// nil.
//
// Possible errors: an empty key, an unknown operator, In or NotIn without
// values, Exists or DoesNotExist with values.
func CompileSelector(es *api.EndpointSelector) (*Selector, error) {
	if es == nil {
		return nil, nil
	}
	reqs := make([]Requirement, 0, len(es.MatchLabels)+len(es.MatchExpressions))
	for k, v := range es.MatchLabels {
		src, key, err := parseSelectorKey(k)
		if err != nil {
			return nil, fmt.Errorf("matchLabels: %w", err)
		}
		reqs = append(reqs, Requirement{Source: src, Key: key, Op: OpIn, Values: []string{v}})
	}
	for i, e := range es.MatchExpressions {
		src, key, err := parseSelectorKey(e.Key)
		if err != nil {
			return nil, fmt.Errorf("matchExpressions[%d]: %w", i, err)
		}
		r, err := compileRequirement(src, key, e.Operator, e.Values)
		if err != nil {
			return nil, fmt.Errorf("matchExpressions[%d]: %w", i, err)
		}
		reqs = append(reqs, r)
	}
	return NewSelector(reqs...), nil
}

// CIDRSelector selects the identities of the addresses in Prefix but not in
// any of Except: the CIDR identities (labels "cidr:<prefix>") whose prefix
// lies inside Prefix and outside every exception, and, for a /0 prefix,
// the world identities of that address family.
type CIDRSelector struct {
	Prefix netip.Prefix
	Except []netip.Prefix // sorted, unique
	str    string
}

// NewCIDRSelector returns the selector of prefix minus the exceptions.
// Exceptions outside prefix are dropped.
func NewCIDRSelector(prefix netip.Prefix, except ...netip.Prefix) *CIDRSelector {
	prefix = prefix.Masked()
	var ex []netip.Prefix
	for _, e := range except {
		e = e.Masked()
		if prefixContains(prefix, e) {
			ex = append(ex, e)
		}
	}
	slices.SortFunc(ex, comparePrefix)
	ex = slices.Compact(ex)
	s := "cidr:" + prefix.String()
	for _, e := range ex {
		s += " except " + e.String()
	}
	return &CIDRSelector{Prefix: prefix, Except: ex, str: s}
}

func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}

// prefixContains reports whether inner lies inside outer.
func prefixContains(outer, inner netip.Prefix) bool {
	return outer.Addr().Is4() == inner.Addr().Is4() && outer.Bits() <= inner.Bits() && outer.Contains(inner.Addr())
}

// Matches implements Matcher.
func (c *CIDRSelector) Matches(id identity.NumericIdentity, lbls labels.Labels) bool {
	if c.Prefix.Bits() == 0 {
		switch id {
		case identity.ReservedIdentityWorld:
			return true
		case identity.ReservedIdentityWorldIPv4:
			return c.Prefix.Addr().Is4()
		case identity.ReservedIdentityWorldIPv6:
			return c.Prefix.Addr().Is6()
		}
	}
	p, ok := CIDRIdentityPrefix(lbls)
	if !ok || !prefixContains(c.Prefix, p) {
		return false
	}
	for _, e := range c.Except {
		if prefixContains(e, p) {
			return false
		}
	}
	return true
}

// String implements Matcher: "cidr:10.0.0.0/8 except 10.1.0.0/16".
func (c *CIDRSelector) String() string { return c.str }

// CIDRLabel returns the label of the CIDR identity of prefix: source
// "cidr", the prefix as key, with ":" written as "-" for IPv6 as Cilium
// does ("cidr:10.0.0.0/8", "cidr:2001-db8--/32").
func CIDRLabel(prefix netip.Prefix) labels.Label {
	return labels.Make(labels.SourceCIDR, strings.ReplaceAll(prefix.Masked().String(), ":", "-"), "")
}

// CIDRIdentityLabels returns the labels of the local identity of a prefix:
// its CIDR label and "reserved:world", so that the world entity selects it.
func CIDRIdentityLabels(prefix netip.Prefix) labels.Labels {
	return labels.New(CIDRLabel(prefix), labels.Reserved(labels.IDNameWorld))
}

// CIDRIdentityPrefix returns the prefix of a CIDR identity's labels.
func CIDRIdentityPrefix(lbls labels.Labels) (netip.Prefix, bool) {
	for l := range lbls.All() {
		if l.Source != labels.SourceCIDR {
			continue
		}
		s := l.Key
		if strings.Count(s, "-") >= 2 || strings.Contains(s, ":") {
			s = strings.ReplaceAll(s, "-", ":")
		}
		p, err := netip.ParsePrefix(s)
		if err == nil {
			return p.Masked(), true
		}
	}
	return netip.Prefix{}, false
}

// compileRequirement checks one selector expression.
func compileRequirement(source, key string, op api.LabelSelectorOperator, values []string) (Requirement, error) {
	r := Requirement{Source: source, Key: key, Values: values}
	switch op {
	case api.LabelSelectorOpIn, api.LabelSelectorOpNotIn:
		r.Op = OpIn
		if op == api.LabelSelectorOpNotIn {
			r.Op = OpNotIn
		}
		if len(values) == 0 {
			return Requirement{}, fmt.Errorf("operator %s needs values", op)
		}
	case api.LabelSelectorOpExists, api.LabelSelectorOpDoesNotExist:
		r.Op = OpExists
		if op == api.LabelSelectorOpDoesNotExist {
			r.Op = OpDoesNotExist
		}
		if len(values) != 0 {
			return Requirement{}, fmt.Errorf("operator %s takes no values", op)
		}
	default:
		return Requirement{}, fmt.Errorf("unknown operator %q (want In, NotIn, Exists or DoesNotExist)", op)
	}
	return r, nil
}
