package link

import (
	"fmt"
	"strings"
	"testing"
)

func TestHostInterfaceName(t *testing.T) {
	tests := []struct {
		containerID, ifName, want string
	}{
		// Golden values: "lxc" + sha256("<containerID>:<ifName>")[:12].
		{"abc", "eth0", "lxcb133159de544"},
		{"abc", "", "lxcb133159de544"}, // empty means eth0
		{"abc", "net1", "lxc5dcb8fa7925c"},
	}
	for _, tt := range tests {
		got := HostInterfaceName(tt.containerID, tt.ifName)
		if got != tt.want {
			t.Errorf("HostInterfaceName(%q, %q) = %q, want %q", tt.containerID, tt.ifName, got, tt.want)
		}
	}

	seen := map[string]string{}
	for i := range 10000 {
		id := fmt.Sprintf("%064x", i)
		name := HostInterfaceName(id, "eth0")
		if len(name) != maxIfNameLen || !strings.HasPrefix(name, HostIfPrefix) {
			t.Fatalf("HostInterfaceName(%q) = %q: want %d bytes starting with %q", id, name, maxIfNameLen, HostIfPrefix)
		}
		if err := checkIfName(name); err != nil {
			t.Fatal(err)
		}
		if other, dup := seen[name]; dup {
			t.Fatalf("containers %s and %s both get %s", other, id, name)
		}
		seen[name] = id
	}
}

func TestTempPeerName(t *testing.T) {
	host := HostInterfaceName("abc", "eth0")
	if got, want := tempPeerName(host), "tmpb133159de544"; got != want {
		t.Errorf("tempPeerName(%q) = %q, want %q", host, got, want)
	}
	// Names not made by HostInterfaceName still get a valid, distinct name.
	a, b := tempPeerName("veth-a"), tempPeerName("veth-b")
	for _, n := range []string{a, b} {
		if err := checkIfName(n); err != nil || !strings.HasPrefix(n, tmpPeerPrefix) {
			t.Errorf("tempPeerName gave %q (%v)", n, err)
		}
	}
	if a == b {
		t.Errorf("tempPeerName gives %q for two names", a)
	}
}

func TestHostAlias(t *testing.T) {
	tests := []struct {
		alias       string
		cid, ifName string
		ok          bool
	}{
		{hostAlias("abc", "eth0"), "abc", "eth0", true},
		{hostAlias("k8s/abc", "net1"), "k8s/abc", "net1", true},
		{"", "", "", false},
		{"something else", "", "", false},
		{"cellium:abc", "", "", false},
		{"cellium:/eth0", "", "", false},
		{"cellium:abc/", "", "", false},
		{podAlias("lxc123"), "", "", false},
	}
	for _, tt := range tests {
		cid, ifName, ok := parseHostAlias(tt.alias)
		if cid != tt.cid || ifName != tt.ifName || ok != tt.ok {
			t.Errorf("parseHostAlias(%q) = %q, %q, %v; want %q, %q, %v", tt.alias, cid, ifName, ok, tt.cid, tt.ifName, tt.ok)
		}
	}
}

func TestCheckIfName(t *testing.T) {
	for _, name := range []string{"eth0", "lxc0123456789ab", "a", "net-1_x"} {
		if err := checkIfName(name); err != nil {
			t.Errorf("checkIfName(%q) = %v, want nil", name, err)
		}
	}
	for _, name := range []string{"", ".", "..", "lxc0123456789abc", "a/b", "a:b", "a b", "a\tb"} {
		if err := checkIfName(name); err == nil {
			t.Errorf("checkIfName(%q) = nil, want an error", name)
		}
	}
}
