package devkubelet

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestNetnsName(t *testing.T) {
	id := strings.Repeat("ab", 32)
	tests := []struct {
		ns, pod, want string
	}{
		{"demo", "web-1", "cellium-demo-web-1-abababab"},
		{"default", "a.b", "cellium-default-a.b-abababab"},
		// Shortened to 63 bytes, without a dangling separator.
		{"a-very-long-namespace-name-indeed", "and-a-long-pod-name-as-well-xxxxxxxxxxxxx",
			"cellium-a-very-long-namespace-name-indeed-and-a-long-p-abababab"},
	}
	for _, tt := range tests {
		got := netnsName(tt.ns, tt.pod, id)
		if got != tt.want {
			t.Errorf("netnsName(%q, %q) = %q, want %q", tt.ns, tt.pod, got, tt.want)
		}
		if len(got) > maxNetnsName {
			t.Errorf("netnsName(%q, %q) is %d bytes", tt.ns, tt.pod, len(got))
		}
	}
}

func TestPercentile(t *testing.T) {
	ms := func(ns ...int) []time.Duration {
		var out []time.Duration
		for _, n := range ns {
			out = append(out, time.Duration(n)*time.Millisecond)
		}
		return out
	}
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[i] = 100 - i // unsorted on purpose
	}
	tests := []struct {
		name string
		ds   []time.Duration
		p    float64
		want time.Duration
	}{
		{"none", nil, 50, 0},
		{"one", ms(7), 99, 7 * time.Millisecond},
		{"median of 4", ms(4, 1, 3, 2), 50, 2 * time.Millisecond},
		{"p95 of 100", ms(hundred...), 95, 95 * time.Millisecond},
		{"p99 of 100", ms(hundred...), 99, 99 * time.Millisecond},
		{"max", ms(hundred...), 100, 100 * time.Millisecond},
	}
	for _, tt := range tests {
		in := append([]time.Duration(nil), tt.ds...)
		if got := Percentile(tt.ds, tt.p); got != tt.want {
			t.Errorf("%s: Percentile(p%.0f) = %v, want %v", tt.name, tt.p, got, tt.want)
		}
		for i := range in {
			if in[i] != tt.ds[i] {
				t.Fatalf("%s: input modified", tt.name)
			}
		}
	}
}

func TestSandboxStore(t *testing.T) {
	s := sandboxStore{dir: t.TempDir()}
	sb := &Sandbox{ID: newSandboxID(""), Namespace: "ns", Name: "p", UID: "u1", NetnsPath: "/var/run/netns/x",
		IfName: "eth0", State: SandboxReady, ConfList: []byte(`{"name":"n"}`), IP: "10.0.0.2", Created: time.Now().UTC()}
	if len(sb.ID) != 64 {
		t.Fatalf("sandbox ID %q: want 64 hex digits", sb.ID)
	}
	if err := s.save(sb); err != nil {
		t.Fatal(err)
	}
	// Temporary files of an interrupted save are not records.
	if err := os.WriteFile(filepath.Join(s.dir, ".sandbox-123"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := s.load()
	if err != nil || len(got) != 1 || got[0].ID != sb.ID || got[0].IP != "10.0.0.2" || got[0].Key() != "ns/p" ||
		string(got[0].ConfList) != `{"name":"n"}` || got[0].NetnsName() != "x" {
		t.Fatalf("load = %+v, %v", got, err)
	}
	if err := s.remove(sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := s.remove(sb.ID); err != nil {
		t.Errorf("removing a missing record: %v", err)
	}
	// A corrupt record is an error that says what to do.
	if err := os.WriteFile(filepath.Join(s.dir, "abc.json"), []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := s.load(); err == nil || !strings.Contains(err.Error(), "remove its network namespace by hand") {
		t.Errorf("load of a corrupt record: %v", err)
	}
	// A missing directory has no records.
	if got, err := (sandboxStore{dir: filepath.Join(s.dir, "nope")}).load(); err != nil || len(got) != 0 {
		t.Errorf("load of a missing directory = %v, %v", got, err)
	}
}

func TestNetworkSelection(t *testing.T) {
	dir := t.TempDir()
	r := newCNIRuntime(dir, []string{dir}, t.TempDir(), "")
	if _, err := r.network(); !errors.Is(err, errNoNetwork) {
		t.Fatalf("empty directory: %v, want errNoNetwork", err)
	}
	write := func(name, data string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("00-broken.conflist", "{")
	write("README", "not a configuration")
	if _, err := r.network(); !errors.Is(err, errNoNetwork) || !strings.Contains(err.Error(), "00-broken.conflist") {
		t.Fatalf("only a broken file: %v, want errNoNetwork naming it", err)
	}
	write("20-second.conflist", `{"cniVersion":"1.0.0","name":"second","plugins":[{"type":"x"}]}`)
	write("10-first.conflist", `{"cniVersion":"1.0.0","name":"first","plugins":[{"type":"x"}]}`)
	list, err := r.network()
	if err != nil || list.Name != "first" {
		t.Fatalf("network() = %v, %v; want the first valid file in lexical order", list, err)
	}
	if _, err := newCNIRuntime(filepath.Join(dir, "missing"), nil, "", "").network(); !errors.Is(err, errNoNetwork) {
		t.Errorf("missing directory: %v", err)
	}
}

func TestRuntimeConf(t *testing.T) {
	sb := &Sandbox{ID: "abc", Namespace: "ns", Name: "pod", UID: "uid-1", NetnsPath: "/var/run/netns/n", IfName: "eth0"}
	rc := runtimeConf(sb)
	if rc.ContainerID != "abc" || rc.NetNS != "/var/run/netns/n" || rc.IfName != "eth0" {
		t.Errorf("runtime conf %+v", rc)
	}
	want := map[string]string{"IgnoreUnknown": "1", "K8S_POD_NAMESPACE": "ns", "K8S_POD_NAME": "pod",
		"K8S_POD_INFRA_CONTAINER_ID": "abc", "K8S_POD_UID": "uid-1"}
	got := map[string]string{}
	for _, kv := range rc.Args {
		got[kv[0]] = kv[1]
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("CNI_ARGS %s = %q, want %q", k, got[k], v)
		}
	}
}

func TestNewValidates(t *testing.T) {
	_, err := New(Config{}, nil)
	if err == nil {
		t.Fatal("New with an empty config: no error")
	}
	for _, f := range []string{"NodeName", "NodeIP", "CNIConfDir", "CNIBinDirs", "StateDir"} {
		if !strings.Contains(err.Error(), f) {
			t.Errorf("error %q does not name %s", err, f)
		}
	}
	k, err := New(Config{NodeName: "n", NodeIP: netip.MustParseAddr("127.0.0.2"), CNIConfDir: "/x",
		CNIBinDirs: []string{"/y"}, StateDir: t.TempDir()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if k.cfg.Workers != DefaultWorkers || k.cfg.NetnsDir != DefaultNetnsDir {
		t.Errorf("defaults: %+v", k.cfg)
	}
}

func TestSandboxIDPrefix(t *testing.T) {
	id := newSandboxID("50ab")
	if len(id) != 64 || id[:4] != "50ab" {
		t.Fatalf("newSandboxID(50ab) = %q: want 64 hex digits starting with 50ab", id)
	}
	if other := newSandboxID("50ab"); other == id {
		t.Fatalf("two IDs with one prefix are equal: %s", id)
	}
	base := Config{NodeName: "n", NodeIP: netip.MustParseAddr("127.0.0.2"), CNIConfDir: "/c", CNIBinDirs: []string{"/b"}, StateDir: "/s"}
	for _, tt := range []struct {
		prefix string
		ok     bool
	}{{"", true}, {"0123456789ABCDEF", true}, {"0123456789abcdef0", false}, {"xyz", false}, {"ab-", false}} {
		c := base
		c.SandboxIDPrefix = tt.prefix
		if err := c.setDefaults(); (err == nil) != tt.ok {
			t.Errorf("SandboxIDPrefix %q: error %v, want ok %v", tt.prefix, err, tt.ok)
		}
	}
}
