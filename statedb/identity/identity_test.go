package identity

import (
	"strings"
	"testing"

	"github.com/cellium/cellium/statedb/labels"
)

func TestReservedTable(t *testing.T) {
	want := []struct {
		id     NumericIdentity
		name   string
		labels string
	}{
		{1, "host", "reserved:host=;"},
		{2, "world", "reserved:world=;"},
		{3, "unmanaged", "reserved:unmanaged=;"},
		{4, "health", "reserved:health=;"},
		{5, "init", "reserved:init=;"},
		{6, "remote-node", "reserved:remote-node=;"},
		{7, "kube-apiserver", "reserved:kube-apiserver=;reserved:remote-node=;"},
		{8, "ingress", "reserved:ingress=;"},
		{9, "world-ipv4", "reserved:world-ipv4=;"},
		{10, "world-ipv6", "reserved:world-ipv6=;"},
	}
	all := AllReserved()
	if len(all) != len(want) {
		t.Fatalf("AllReserved() has %d entries, want %d", len(all), len(want))
	}
	for i, w := range want {
		r := all[i]
		if r.ID != w.id || r.Name != w.name || r.Labels.SortedList() != w.labels {
			t.Errorf("AllReserved()[%d] = {%d %s %s}, want {%d %s %s}", i, r.ID, r.Name, r.Labels.SortedList(), w.id, w.name, w.labels)
		}
		if got := w.id.String(); got != w.name {
			t.Errorf("%d.String() = %q, want %q", w.id, got, w.name)
		}
		if id, ok := LookupReservedByName(w.name); !ok || id != w.id {
			t.Errorf("LookupReservedByName(%q) = %d, %v", w.name, id, ok)
		}
		if id, ok := LookupReservedByLabels(r.Labels); !ok || id != w.id {
			t.Errorf("LookupReservedByLabels(%v) = %d, %v; want %d", r.Labels, id, ok, w.id)
		}
		if !w.id.IsReserved() {
			t.Errorf("%d.IsReserved() = false", w.id)
		}
	}
	for _, id := range []NumericIdentity{0, 11, 100, 128, 256, 65535} {
		if _, ok := LookupReserved(id); ok || id.IsReserved() {
			t.Errorf("%d is reported reserved", id)
		}
	}
	for _, name := range []string{"unknown", "cluster", "none", "all", ""} {
		if _, ok := LookupReservedByName(name); ok {
			t.Errorf("LookupReservedByName(%q) found an identity", name)
		}
	}
}

func TestLookupReservedByLabels(t *testing.T) {
	tests := []struct {
		labels []string
		want   NumericIdentity // 0: not reserved
	}{
		{[]string{"reserved:host"}, ReservedIdentityHost},
		{[]string{"reserved:host", "reserved:kube-apiserver"}, ReservedIdentityHost},
		{[]string{"reserved:host", "k8s:node-role=x"}, ReservedIdentityHost},
		{[]string{"reserved:remote-node"}, ReservedIdentityRemoteNode},
		{[]string{"reserved:remote-node", "reserved:kube-apiserver"}, ReservedIdentityKubeAPIServer},
		{[]string{"reserved:kube-apiserver"}, ReservedIdentityKubeAPIServer},
		{[]string{"reserved:world"}, ReservedIdentityWorld},
		{[]string{"reserved:world=x"}, ReservedIdentityWorld}, // value ignored for a single label
		{[]string{"reserved:health"}, ReservedIdentityHealth},
		{[]string{"reserved:init"}, ReservedIdentityInit},
		{[]string{"reserved:unmanaged"}, ReservedIdentityUnmanaged},
		{[]string{"reserved:ingress"}, ReservedIdentityIngress},
		{[]string{"reserved:world-ipv4"}, ReservedIdentityWorldIPv4},
		{[]string{"reserved:world-ipv6"}, ReservedIdentityWorldIPv6},
		// Not reserved.
		{nil, 0},
		{[]string{"k8s:app=web"}, 0},
		{[]string{"reserved:world", "k8s:app=web"}, 0}, // a workload cannot claim world
		{[]string{"reserved:health", "reserved:init"}, 0},
		{[]string{"reserved:unknown"}, 0},
		{[]string{"reserved:cluster"}, 0},
		{[]string{"k8s:host"}, 0},
		{[]string{"reserved:host=x"}, ReservedIdentityHost}, // single label: by name, value ignored
		{[]string{"reserved:host=x", "k8s:app=web"}, 0},     // with others, "reserved:host" must match exactly
		{[]string{"reserved:host", "k8s:io.cilium.fixed-identity=x"}, 0},
		{[]string{"cidr:10.0.0.0/8", "reserved:world"}, 0},
	}
	for _, tt := range tests {
		id, ok := LookupReservedByLabels(labels.ParseLabels(tt.labels...))
		if ok != (tt.want != 0) || id != tt.want {
			t.Errorf("LookupReservedByLabels(%q) = %d, %v; want %d", tt.labels, id, ok, tt.want)
		}
	}
}

func TestScopeForLabels(t *testing.T) {
	tests := []struct {
		labels []string
		want   NumericIdentity
	}{
		{[]string{"k8s:app=web"}, IdentityScopeGlobal},
		{nil, IdentityScopeGlobal},
		{[]string{"cidr:10.0.0.0/8", "reserved:world"}, IdentityScopeLocal},
		{[]string{"fqdn:*.example.com"}, IdentityScopeLocal},
		{[]string{"cidrgroup:corp"}, IdentityScopeLocal},
		{[]string{"cidr:10.0.0.0/8", "k8s:app=web"}, IdentityScopeGlobal},
		{[]string{"reserved:remote-node", "k8s:node=x"}, IdentityScopeRemoteNode},
	}
	for _, tt := range tests {
		if got := ScopeForLabels(labels.ParseLabels(tt.labels...)); got != tt.want {
			t.Errorf("ScopeForLabels(%q) = %#x, want %#x", tt.labels, got, tt.want)
		}
	}
}

func TestNumericIdentity(t *testing.T) {
	if InvalidIdentity.String() != "unknown" {
		t.Errorf("0.String() = %q", InvalidIdentity.String())
	}
	if got := NumericIdentity(40321).String(); got != "40321" {
		t.Errorf("String() = %q", got)
	}
	if got := ReservedIdentityHost.StringID(); got != "1" {
		t.Errorf("StringID() = %q", got)
	}
	if MinLocalIdentity != 16777217 || MaxLocalIdentity != 33554431 {
		t.Errorf("local range = %d..%d", MinLocalIdentity, MaxLocalIdentity)
	}
	tests := []struct {
		id           NumericIdentity
		scope        NumericIdentity
		local, users bool
	}{
		{1, IdentityScopeGlobal, false, false},
		{128, IdentityScopeGlobal, false, true},
		{255, IdentityScopeGlobal, false, true},
		{256, IdentityScopeGlobal, false, false},
		{MinLocalIdentity, IdentityScopeLocal, true, false},
		{MaxLocalIdentity, IdentityScopeLocal, true, false},
		{IdentityScopeRemoteNode | 5, IdentityScopeRemoteNode, false, false},
	}
	for _, tt := range tests {
		if tt.id.Scope() != tt.scope || tt.id.HasLocalScope() != tt.local || tt.id.IsUserReserved() != tt.users {
			t.Errorf("%d: scope %#x local %v user %v", tt.id, tt.id.Scope(), tt.id.HasLocalScope(), tt.id.IsUserReserved())
		}
	}
}

func TestParseNumericIdentity(t *testing.T) {
	for s, want := range map[string]NumericIdentity{"0": 0, "1": 1, "40321": 40321, "4294967295": 4294967295} {
		if got, err := ParseNumericIdentity(s); err != nil || got != want {
			t.Errorf("ParseNumericIdentity(%q) = %d, %v", s, got, err)
		}
	}
	for _, s := range []string{"", "-1", "0x10", "4294967296", "host", "1.5"} {
		if _, err := ParseNumericIdentity(s); err == nil {
			t.Errorf("ParseNumericIdentity(%q) succeeded", s)
		}
	}
}

func TestLayout(t *testing.T) {
	tests := []struct {
		clusterID, maxClusters uint32
		min, max               NumericIdentity
	}{
		{0, 255, 256, 65535},
		{1, 255, 65536, 131071},
		{255, 255, 255 << 16, 1<<24 - 1},
		{0, 511, 256, 32767},
		{1, 511, 32768, 65535},
		{511, 511, 511 << 15, 1<<24 - 1},
	}
	for _, tt := range tests {
		l, err := NewLayout(tt.clusterID, tt.maxClusters)
		if err != nil {
			t.Fatalf("NewLayout(%d, %d): %v", tt.clusterID, tt.maxClusters, err)
		}
		if l.MinAllocation() != tt.min || l.MaxAllocation() != tt.max {
			t.Errorf("NewLayout(%d, %d) range = %d..%d, want %d..%d",
				tt.clusterID, tt.maxClusters, l.MinAllocation(), l.MaxAllocation(), tt.min, tt.max)
		}
		if !l.InAllocationRange(tt.min) || !l.InAllocationRange(tt.max) ||
			l.InAllocationRange(tt.min-1) || l.InAllocationRange(tt.max+1) {
			t.Errorf("NewLayout(%d, %d): InAllocationRange wrong at the bounds", tt.clusterID, tt.maxClusters)
		}
		if got := l.ClusterIDOf(tt.max); got != tt.clusterID {
			t.Errorf("ClusterIDOf(%d) = %d, want %d", tt.max, got, tt.clusterID)
		}
		if got := l.ClusterIDOf(tt.max | IdentityScopeLocal); got != tt.clusterID {
			t.Errorf("ClusterIDOf ignores scope bits: got %d, want %d", got, tt.clusterID)
		}
		if l.ClusterID() != tt.clusterID {
			t.Errorf("ClusterID() = %d", l.ClusterID())
		}
	}
	if d := DefaultLayout(); d.MinAllocation() != 256 || d.MaxAllocation() != 65535 {
		t.Errorf("DefaultLayout range = %d..%d", d.MinAllocation(), d.MaxAllocation())
	}
	// No reserved or user-reserved identity is ever in an allocation range.
	for _, c := range []uint32{0, 1, 255} {
		l, _ := NewLayout(c, 255)
		for id := NumericIdentity(0); id < MinimalNumericIdentity; id++ {
			if l.InAllocationRange(id) {
				t.Fatalf("cluster %d may allocate %d", c, id)
			}
		}
	}
}

func TestNewLayoutErrors(t *testing.T) {
	tests := []struct {
		clusterID, maxClusters uint32
		flag                   string
	}{
		{0, 256, "--max-connected-clusters"},
		{0, 0, "--max-connected-clusters"},
		{256, 255, "--cluster-id"},
		{512, 511, "--cluster-id"},
	}
	for _, tt := range tests {
		_, err := NewLayout(tt.clusterID, tt.maxClusters)
		if err == nil || !strings.Contains(err.Error(), tt.flag) {
			t.Errorf("NewLayout(%d, %d) error = %v, want one naming %s", tt.clusterID, tt.maxClusters, err, tt.flag)
		}
	}
}
