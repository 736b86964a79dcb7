package labels

import (
	"encoding/json"
	"testing"
)

func TestParse(t *testing.T) {
	tests := []struct {
		in   string
		want Label
	}{
		{"k8s:app=web", Label{Source: "k8s", Key: "app", Value: "web"}},
		{"k8s:app", Label{Source: "k8s", Key: "app"}},
		{"k8s:app=", Label{Source: "k8s", Key: "app"}},
		{"app=web", Label{Source: "unspec", Key: "app", Value: "web"}},
		{"app", Label{Source: "unspec", Key: "app"}},
		{":app=web", Label{Source: "unspec", Key: "app", Value: "web"}},
		{"", Label{Source: "unspec"}},
		// The value runs to the end and may hold "=" and ":".
		{"k8s:app==web", Label{Source: "k8s", Key: "app", Value: "=web"}},
		{"k8s:app=a=b", Label{Source: "k8s", Key: "app", Value: "a=b"}},
		{"k8s:app=a:b", Label{Source: "k8s", Key: "app", Value: "a:b"}},
		// Only the first ":" separates the source.
		{"k8s::app=web", Label{Source: "k8s", Key: ":app", Value: "web"}},
		{"k8s:a:b=c", Label{Source: "k8s", Key: "a:b", Value: "c"}},
		// ... even when an "=" comes first.
		{"a=b:c", Label{Source: "a=b", Key: "c"}},
		// Reserved shorthands.
		{"$host", Label{Source: "reserved", Key: "host"}},
		{"$host=x", Label{Source: "reserved", Key: "host", Value: "x"}},
		{"reserved.host", Label{Source: "reserved", Key: "host"}},
		{"reserved.x=y", Label{Source: "reserved", Key: "x", Value: "y"}},
		{"reserved:host", Label{Source: "reserved", Key: "host"}},
		{"reserved:=host", Label{Source: "reserved", Key: "host"}},
		{"$=host", Label{Source: "reserved", Key: "host"}},
		{"k8s:=v", Label{Source: "k8s", Value: "v"}},
		// "reserved." only counts when there is no ":".
		{"reserved.a:b", Label{Source: "reserved.a", Key: "b"}},
		{"cidr:10.0.0.0/8", Label{Source: "cidr", Key: "10.0.0.0/8"}},
		{"k8s:io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name=default",
			Label{Source: "k8s", Key: "io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name", Value: "default"}},
	}
	for _, tt := range tests {
		if got := Parse(tt.in); got != tt.want {
			t.Errorf("Parse(%q) = %#v, want %#v", tt.in, got, tt.want)
		}
	}
}

func TestParseSelect(t *testing.T) {
	tests := []struct {
		in   string
		want Label
	}{
		{"app=web", Label{Source: "any", Key: "app", Value: "web"}},
		{"k8s:app=web", Label{Source: "k8s", Key: "app", Value: "web"}},
		{"unspec:app", Label{Source: "any", Key: "app"}},
		{"$world", Label{Source: "reserved", Key: "world"}},
	}
	for _, tt := range tests {
		if got := ParseSelect(tt.in); got != tt.want {
			t.Errorf("ParseSelect(%q) = %#v, want %#v", tt.in, got, tt.want)
		}
	}
}

func TestLabelPrint(t *testing.T) {
	tests := []struct {
		l                 Label
		str, kv, extended string
	}{
		{Make("k8s", "app", "web"), "k8s:app=web", "k8s:app=web;", "k8s.app"},
		{Reserved(IDNameHost), "reserved:host", "reserved:host=;", "reserved.host"},
		{Make("", "x", ""), "unspec:x", "unspec:x=;", "unspec.x"},
		{Make("k8s", "a", "=b"), "k8s:a==b", "k8s:a==b;", "k8s.a"},
	}
	for _, tt := range tests {
		if got := tt.l.String(); got != tt.str {
			t.Errorf("%#v.String() = %q, want %q", tt.l, got, tt.str)
		}
		if got := tt.l.KVStoreString(); got != tt.kv {
			t.Errorf("%#v.KVStoreString() = %q, want %q", tt.l, got, tt.kv)
		}
		if got := tt.l.ExtendedKey(); got != tt.extended {
			t.Errorf("%#v.ExtendedKey() = %q, want %q", tt.l, got, tt.extended)
		}
	}
}

func TestExtendedKeyFrom(t *testing.T) {
	tests := map[string]string{
		"k8s:app=web":       "k8s.app",
		"container:foo=bar": "container.foo",
		"app=web":           "any.app",
		"app":               "any.app",
		"$host":             "reserved.host",
	}
	for in, want := range tests {
		if got := ExtendedKeyFrom(in); got != want {
			t.Errorf("ExtendedKeyFrom(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestLabelMatches(t *testing.T) {
	web := Make("k8s", "app", "web")
	tests := []struct {
		sel, target Label
		want        bool
	}{
		{web, web, true},
		{Make("any", "app", "web"), web, true},
		{Make("container", "app", "web"), web, false},
		{Make("k8s", "app", "db"), web, false},
		{Make("k8s", "app", ""), web, false},
		{web, Make("any", "app", "web"), false},
	}
	for _, tt := range tests {
		if got := tt.sel.Matches(tt.target); got != tt.want {
			t.Errorf("%v.Matches(%v) = %v, want %v", tt.sel, tt.target, got, tt.want)
		}
	}
}

func TestLabelJSON(t *testing.T) {
	b, err := json.Marshal(Make("k8s", "app", "web"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(b), `{"key":"app","value":"web","source":"k8s"}`; got != want {
		t.Errorf("Marshal = %s, want %s", got, want)
	}
	b, _ = json.Marshal(Reserved(IDNameHost))
	if got, want := string(b), `{"key":"host","source":"reserved"}`; got != want {
		t.Errorf("Marshal = %s, want %s", got, want)
	}

	tests := []struct {
		in      string
		want    Label
		wantErr bool
	}{
		{`{"key":"app","value":"web","source":"k8s"}`, Make("k8s", "app", "web"), false},
		{`{"key":"host","source":"reserved"}`, Reserved("host"), false},
		{`"k8s:app=web"`, Make("k8s", "app", "web"), false},
		{`"$host"`, Reserved("host"), false},
		{`{"value":"x","source":"k8s"}`, Label{}, true},
		{`""`, Label{}, true},
		{`42`, Label{}, true},
	}
	for _, tt := range tests {
		var l Label
		err := json.Unmarshal([]byte(tt.in), &l)
		if (err != nil) != tt.wantErr {
			t.Errorf("Unmarshal(%s) error = %v, wantErr %v", tt.in, err, tt.wantErr)
			continue
		}
		if err == nil && l != tt.want {
			t.Errorf("Unmarshal(%s) = %#v, want %#v", tt.in, l, tt.want)
		}
	}
}
