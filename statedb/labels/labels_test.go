package labels

import (
	"encoding/json"
	"maps"
	"slices"
	"testing"
)

func TestNewSortsAndDedups(t *testing.T) {
	ls := New(
		Make("k8s", "zeta", "1"),
		Make("k8s", "app", "a"),
		Label{}, // no key: skipped
		Make("container", "app", "b"),
		Make("k8s", "io.kubernetes.pod.namespace", "default"),
	)
	want := []string{"container:app=b", "k8s:io.kubernetes.pod.namespace=default", "k8s:zeta=1"}
	if got := ls.Strings(); !slices.Equal(got, want) {
		t.Errorf("Strings() = %q, want %q", got, want)
	}
	if ls.Len() != 3 {
		t.Errorf("Len() = %d, want 3", ls.Len())
	}
}

func TestSortedList(t *testing.T) {
	tests := []struct {
		ls   Labels
		want string
	}{
		{Labels{}, ""},
		{New(Reserved(IDNameHost)), "reserved:host=;"},
		{ParseLabels("k8s:io.kubernetes.pod.namespace=default", "k8s:app=web", "k8s:io.cilium.k8s.policy.cluster=default"),
			"k8s:app=web;k8s:io.cilium.k8s.policy.cluster=default;k8s:io.kubernetes.pod.namespace=default;"},
		{New(Reserved(IDNameRemoteNode), Reserved(IDNameKubeAPIServer)), "reserved:kube-apiserver=;reserved:remote-node=;"},
	}
	for _, tt := range tests {
		if got := tt.ls.SortedList(); got != tt.want {
			t.Errorf("SortedList() = %q, want %q", got, tt.want)
		}
		if back := ParseSortedList(tt.ls.SortedList()); !back.Equal(tt.ls) {
			t.Errorf("ParseSortedList(%q) = %v, want %v", tt.ls.SortedList(), back, tt.ls)
		}
	}
}

func TestSortedListIndependentOfOrder(t *testing.T) {
	a := ParseLabels("k8s:b=2", "k8s:a=1", "k8s:c=3")
	b := ParseLabels("k8s:c=3", "k8s:b=2", "k8s:a=1")
	if a.SortedList() != b.SortedList() || !a.Equal(b) || a.Compare(b) != 0 {
		t.Errorf("order of construction changed the set: %q vs %q", a.SortedList(), b.SortedList())
	}
}

func TestGetHas(t *testing.T) {
	ls := ParseLabels("k8s:app=web", "reserved:host", "k8s:tier=db")
	if l, ok := ls.Get("tier"); !ok || l != Make("k8s", "tier", "db") {
		t.Errorf("Get(tier) = %v, %v", l, ok)
	}
	if _, ok := ls.Get("nope"); ok {
		t.Error("Get(nope) found a label")
	}
	tests := []struct {
		sel  string
		want bool
	}{
		{"k8s:app=web", true},
		{"any:app=web", true},
		{"container:app=web", false},
		{"k8s:app=db", false},
		{"reserved:host", true},
		{"reserved:world", false},
	}
	for _, tt := range tests {
		if got := ls.Has(Parse(tt.sel)); got != tt.want {
			t.Errorf("Has(%s) = %v, want %v", tt.sel, got, tt.want)
		}
	}
	if !ls.HasSource(SourceReserved) || ls.HasSource(SourceCIDR) {
		t.Error("HasSource wrong")
	}
}

func TestOnlySources(t *testing.T) {
	tests := []struct {
		ls   Labels
		want bool
	}{
		{Labels{}, false},
		{ParseLabels("cidr:10.0.0.0/8", "reserved:world"), true},
		{ParseLabels("cidr:10.0.0.0/8", "k8s:app=web"), false},
	}
	for _, tt := range tests {
		if got := tt.ls.OnlySources(SourceCIDR, SourceReserved); got != tt.want {
			t.Errorf("%v.OnlySources = %v, want %v", tt.ls, got, tt.want)
		}
	}
}

func TestMergeAndFilter(t *testing.T) {
	a := ParseLabels("k8s:app=web", "k8s:tier=fe")
	b := ParseLabels("container:app=other", "k8s:z=1")
	got := a.Merge(b)
	want := ParseLabels("container:app=other", "k8s:tier=fe", "k8s:z=1")
	if !got.Equal(want) {
		t.Errorf("Merge = %v, want %v", got, want)
	}
	if a.String() != "k8s:app=web,k8s:tier=fe" {
		t.Errorf("Merge modified its receiver: %v", a)
	}
	k8s := got.FilterFunc(func(l Label) bool { return l.Source == SourceK8s })
	if k8s.String() != "k8s:tier=fe,k8s:z=1" {
		t.Errorf("FilterFunc = %v", k8s)
	}
}

func TestListIsACopy(t *testing.T) {
	ls := ParseLabels("k8s:app=web")
	l := ls.List()
	l[0].Value = "changed"
	if v, _ := ls.Get("app"); v.Value != "web" {
		t.Error("List exposed the set's storage")
	}
}

func TestFromMap(t *testing.T) {
	// A CiliumIdentity's security-labels.
	got := FromMap(map[string]string{
		"k8s:app":                         "web",
		"k8s:io.kubernetes.pod.namespace": "default",
		"reserved:":                       "host",
		"noprefix":                        "v",
		"k8s:a=b":                         "c",
	}, "")
	want := New(
		Make("k8s", "app", "web"),
		Make("k8s", "io.kubernetes.pod.namespace", "default"),
		Reserved("host"),
		Make("unspec", "noprefix", "v"),
		Make("k8s", "a=b", "c"),
	)
	if !got.Equal(want) {
		t.Errorf("FromMap = %v, want %v", got, want)
	}
	if m := got.Map(); !maps.Equal(m, map[string]string{
		"k8s:app": "web", "k8s:io.kubernetes.pod.namespace": "default",
		"reserved:host": "", "unspec:noprefix": "v", "k8s:a=b": "c",
	}) {
		t.Errorf("Map() = %v", m)
	}

	// With a source, a prefix in the key is dropped.
	got = FromMap(map[string]string{"k8s:foo": "bar", "reserved.x": "y", "plain": "z"}, "cilium")
	want = ParseLabels("cilium:foo=bar", "cilium:x=y", "cilium:plain=z")
	if !got.Equal(want) {
		t.Errorf("FromMap with source = %v, want %v", got, want)
	}
}

func TestFromMapClashIsDeterministic(t *testing.T) {
	m := map[string]string{"k8s:app": "a", "container:app": "b"}
	for range 20 {
		if got := FromMap(m, ""); got.String() != "k8s:app=a" {
			t.Fatalf("FromMap = %v, want k8s:app=a (last key in sort order wins)", got)
		}
	}
}

func TestLabelsJSON(t *testing.T) {
	ls := ParseLabels("k8s:app=web", "reserved:host")
	b, err := json.Marshal(ls)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(b), `["k8s:app=web","reserved:host"]`; got != want {
		t.Errorf("Marshal = %s, want %s", got, want)
	}
	var back Labels
	if err := json.Unmarshal(b, &back); err != nil || !back.Equal(ls) {
		t.Errorf("Unmarshal = %v, %v; want %v", back, err, ls)
	}
	if err := json.Unmarshal([]byte(`[{"key":"app","value":"web","source":"k8s"}]`), &back); err != nil || back.String() != "k8s:app=web" {
		t.Errorf("Unmarshal objects = %v, %v", back, err)
	}
	if err := json.Unmarshal([]byte(`{"k8s:app":"web"}`), &back); err == nil {
		t.Error("Unmarshal of an object succeeded")
	}
	if b, _ := json.Marshal(Labels{}); string(b) != "[]" {
		t.Errorf("Marshal(empty) = %s, want []", b)
	}
}
