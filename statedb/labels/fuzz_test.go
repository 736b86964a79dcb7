package labels

import (
	"strings"
	"testing"
)

// Parse accepts every string; printing and parsing again is stable except
// for the documented reserved "=" quirk.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"", "k8s:app=web", "$host", "reserved.x", "a=b:c", "reserved:==x", ":", "=", "$", "k8s::a==b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		l := Parse(s)
		if l.Source == "" {
			t.Fatalf("Parse(%q) has no source", s)
		}
		if !strings.HasPrefix(s, "$") && !strings.HasPrefix(s, "reserved.") && strings.Contains(s, ":") {
			// The source is the text before the first ":".
			if want := s[:strings.IndexByte(s, ':')]; want != "" && l.Source != want {
				t.Fatalf("Parse(%q).Source = %q, want %q", s, l.Source, want)
			}
		}
		// A reserved key may hold "=" ("reserved:==x" has key "=x",
		// "$=a=b" has key "a=b"), which does not read back as the same key.
		if l.Source == SourceReserved && strings.Contains(l.Key, "=") {
			return
		}
		if again := Parse(l.String()); again != l {
			t.Fatalf("Parse(%q) = %#v, but Parse(%q) = %#v", s, l, l.String(), again)
		}
		if l.IsValid() && !strings.Contains(l.Source+l.Key+l.Value, ";") {
			ls := New(l)
			if back := ParseSortedList(ls.SortedList()); !back.Equal(ls) {
				t.Fatalf("SortedList %q read back as %v, want %v", ls.SortedList(), back, ls)
			}
		}
	})
}

// Labels built from parts round-trip through String when they are in the
// canonical form Cilium prints: a plain source and a key without "=".
func FuzzLabelRoundTrip(f *testing.F) {
	f.Add("k8s", "app", "web")
	f.Add("reserved", "host", "")
	f.Add("k8s", "a:b", "=c;d")
	f.Fuzz(func(t *testing.T, source, key, value string) {
		if source == "" || strings.ContainsAny(source, ":") || strings.HasPrefix(source, "$") ||
			strings.Contains(key, "=") || (source == SourceReserved && key == "" && value != "") {
			t.Skip("not a canonical label")
		}
		l := Make(source, key, value)
		if got := Parse(l.String()); got != l {
			t.Fatalf("Parse(%q) = %#v, want %#v", l.String(), got, l)
		}
	})
}

// The filter's decision depends on the label only, never on the set it is
// in, and Split partitions the set.
func FuzzFilterSplit(f *testing.F) {
	f.Add("k8s:app=web", "k8s:pod-template-hash=x", "reserved:host")
	f.Fuzz(func(t *testing.T, a, b, c string) {
		ls := ParseLabels(a, b, c)
		filter := DefaultFilter()
		id, info := filter.Split(ls)
		if id.Len()+info.Len() != ls.Len() || !id.Merge(info).Equal(ls) {
			t.Fatalf("Split(%v) = %v + %v", ls, id, info)
		}
		for l := range id.All() {
			if !filter.Relevant(l) {
				t.Fatalf("%v in identity labels but not relevant", l)
			}
		}
		for l := range info.All() {
			if filter.Relevant(l) {
				t.Fatalf("%v in info labels but relevant", l)
			}
		}
	})
}
