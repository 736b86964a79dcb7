package labels

import (
	"cmp"
	"encoding/json"
	"fmt"
	"iter"
	"slices"
	"strings"
)

// Labels is an immutable set of labels with at most one label per key,
// sorted by key. The zero value is the empty set. Methods never modify the
// receiver; those that change the set return a new one.
//
// One label per key is Cilium's model too: "k8s:app=a" and "container:app=b"
// cannot both be in a set. Constructors resolve such a clash by keeping the
// label given last.
//
// The JSON form is the sorted list of label strings, e.g.
// ["k8s:app=web","k8s:io.kubernetes.pod.namespace=default"], as in a
// CiliumEndpoint's status.identity.labels.
type Labels struct {
	// sorted by Key, keys unique.
	lbls []Label
}

// New returns the set of the given labels. Labels without a key are
// skipped; of several labels with the same key the last one is kept.
func New(lbls ...Label) Labels {
	s := make([]Label, 0, len(lbls))
	for _, l := range lbls {
		if l.IsValid() {
			s = append(s, l)
		}
	}
	// A stable sort keeps the input order among equal keys, so the last of
	// them is the one that survives the compaction below.
	slices.SortStableFunc(s, func(a, b Label) int { return strings.Compare(a.Key, b.Key) })
	out := s[:0]
	for i, l := range s {
		if i+1 < len(s) && s[i+1].Key == l.Key {
			continue
		}
		out = append(out, l)
	}
	return Labels{lbls: slices.Clip(out)}
}

// ParseLabels parses each string with Parse and returns the set, skipping
// strings that give no key (such as ""); see New for duplicate keys.
func ParseLabels(ss ...string) Labels {
	lbls := make([]Label, 0, len(ss))
	for _, s := range ss {
		lbls = append(lbls, Parse(s))
	}
	return New(lbls...)
}

// ParseSortedList reads the SortedList form back ("k8s:app=web;k8s:x=;").
// Keys and values that themselves contain ";" do not survive the round trip.
func ParseSortedList(s string) Labels {
	return ParseLabels(strings.Split(s, ";")...)
}

// FromMap builds a set from a key -> value map, reading each key the way
// Cilium does for maps of labels:
//
//   - A source prefix in the key ("k8s:app", "$host", "reserved.host") is
//     split off. The key is not split at "=": the map value is the value.
//   - If source is empty, the prefix is the label's source (default
//     "unspec"); this reads a CiliumIdentity's security-labels
//     ({"k8s:app": "web"} gives "k8s:app=web"). Otherwise every label gets
//     source and the prefix is dropped.
//   - A reserved prefix with an empty key takes the value as the key
//     ({"reserved:": "host"} gives "reserved:host").
//
// Of keys that name the same label key, the one that sorts last wins.
func FromMap(m map[string]string, source string) Labels {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys) // deterministic result when keys clash
	lbls := make([]Label, 0, len(m))
	for _, k := range keys {
		src, key := splitSource(k)
		l := Label{Key: key, Value: m[k], Source: cmp.Or(source, src, SourceUnspec)}
		if src == SourceReserved && key == "" {
			l.Key, l.Value = l.Value, ""
		}
		lbls = append(lbls, l)
	}
	return New(lbls...)
}

// Len returns the number of labels in the set.
func (ls Labels) Len() int { return len(ls.lbls) }

// All iterates over the labels in key order.
func (ls Labels) All() iter.Seq[Label] { return slices.Values(ls.lbls) }

// List returns the labels in key order, in a new slice.
func (ls Labels) List() []Label { return slices.Clone(ls.lbls) }

// Get returns the label with the given key.
func (ls Labels) Get(key string) (Label, bool) {
	i, ok := slices.BinarySearchFunc(ls.lbls, key, func(l Label, k string) int { return strings.Compare(l.Key, k) })
	if !ok {
		return Label{}, false
	}
	return ls.lbls[i], true
}

// Has reports whether some label of the set is selected by sel (see
// Label.Matches: a selector of source "any" matches every source).
func (ls Labels) Has(sel Label) bool {
	l, ok := ls.Get(sel.Key)
	return ok && sel.Matches(l)
}

// HasSource reports whether some label of the set has the given source.
func (ls Labels) HasSource(source string) bool {
	return slices.ContainsFunc(ls.lbls, func(l Label) bool { return l.Source == source })
}

// OnlySources reports whether the set is not empty and every label has one
// of the given sources.
func (ls Labels) OnlySources(sources ...string) bool {
	if len(ls.lbls) == 0 {
		return false
	}
	for _, l := range ls.lbls {
		if !slices.Contains(sources, l.Source) {
			return false
		}
	}
	return true
}

// Equal reports whether both sets hold the same labels.
func (ls Labels) Equal(other Labels) bool { return slices.Equal(ls.lbls, other.lbls) }

// Compare orders sets by their labels (key, then source, then value), label
// by label; a prefix sorts first.
func (ls Labels) Compare(other Labels) int {
	return slices.CompareFunc(ls.lbls, other.lbls, func(a, b Label) int {
		return cmp.Or(strings.Compare(a.Key, b.Key), strings.Compare(a.Source, b.Source), strings.Compare(a.Value, b.Value))
	})
}

// Merge returns the union of ls and other; for a key present in both, the
// label of other wins.
func (ls Labels) Merge(other Labels) Labels {
	return New(slices.Concat(ls.lbls, other.lbls)...)
}

// FilterFunc returns the labels for which keep returns true.
func (ls Labels) FilterFunc(keep func(Label) bool) Labels {
	var out []Label
	for _, l := range ls.lbls {
		if keep(l) {
			out = append(out, l)
		}
	}
	return Labels{lbls: out}
}

// Strings returns the labels printed with Label.String, in key order.
func (ls Labels) Strings() []string {
	out := make([]string, len(ls.lbls))
	for i, l := range ls.lbls {
		out[i] = l.String()
	}
	return out
}

// String prints the set as its labels joined by ",", in key order
// ("k8s:app=web,k8s:io.kubernetes.pod.namespace=default").
func (ls Labels) String() string { return strings.Join(ls.Strings(), ",") }

// SortedList returns the canonical identity key of the set: each label as
// "source:key=value;" (see Label.KVStoreString), in key order, concatenated.
// This is the value of a kvstore "identities/v1/id/<ID>" key and the label
// part of the "value/" keys, byte for byte as Cilium writes them. The empty
// set gives "".
func (ls Labels) SortedList() string {
	var b strings.Builder
	for _, l := range ls.lbls {
		b.WriteString(l.Source)
		b.WriteByte(':')
		b.WriteString(l.Key)
		b.WriteByte('=')
		b.WriteString(l.Value)
		b.WriteByte(';')
	}
	return b.String()
}

// Map returns the set as a "source:key" -> value map, the form of a
// CiliumIdentity's security-labels.
func (ls Labels) Map() map[string]string {
	m := make(map[string]string, len(ls.lbls))
	for _, l := range ls.lbls {
		m[l.Source+":"+l.Key] = l.Value
	}
	return m
}

// MarshalJSON writes the set as a sorted JSON array of label strings.
func (ls Labels) MarshalJSON() ([]byte, error) {
	return json.Marshal(ls.Strings())
}

// UnmarshalJSON reads a JSON array of label strings (as written by
// MarshalJSON) or of label objects.
//
// Possible errors: the input is not an array of strings or label objects.
func (ls *Labels) UnmarshalJSON(data []byte) error {
	var lbls []Label
	if err := json.Unmarshal(data, &lbls); err != nil {
		return fmt.Errorf("labels: %w", err)
	}
	*ls = New(lbls...)
	return nil
}
