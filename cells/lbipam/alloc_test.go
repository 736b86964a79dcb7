package lbipam

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
)

var t0 = time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)

func mkPool(name string, age int, blocks ...string) *ciliumv2.CiliumLoadBalancerIPPool {
	p := &ciliumv2.CiliumLoadBalancerIPPool{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(t0.Add(time.Duration(age) * time.Second))}}
	for _, b := range blocks {
		if from, to, ok := strings.Cut(b, "-"); ok {
			p.Spec.Blocks = append(p.Spec.Blocks, ciliumv2.CiliumLoadBalancerIPPoolIPBlock{Start: from, Stop: to})
		} else {
			p.Spec.Blocks = append(p.Spec.Blocks, ciliumv2.CiliumLoadBalancerIPPoolIPBlock{Cidr: ciliumv2.IPv4orIPv6CIDR(b)})
		}
	}
	return p
}

func mkSvc(name string, age int) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name),
			CreationTimestamp: metav1.NewTime(t0.Add(time.Duration(age) * time.Second))},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer},
	}
}

func svcOutcome(t *testing.T, out Outcome, name string) ServiceOutcome {
	t.Helper()
	for _, o := range out.Services {
		if o.Service.Name == name {
			return o
		}
	}
	t.Fatalf("no outcome for Service %s", name)
	return ServiceOutcome{}
}

func poolOutcome(t *testing.T, out Outcome, name string) PoolOutcome {
	t.Helper()
	for _, o := range out.Pools {
		if o.Pool.Name == name {
			return o
		}
	}
	t.Fatalf("no outcome for pool %s", name)
	return PoolOutcome{}
}

func ips(o ServiceOutcome) string {
	var s []string
	for _, a := range o.IPs {
		s = append(s, a.String())
	}
	return strings.Join(s, ",")
}

// withStatus is svc with o's addresses in its status, as the controller
// writes them.
func withStatus(svc *corev1.Service, o ServiceOutcome) *corev1.Service {
	svc = svc.DeepCopy()
	svc.Status = serviceStatus(svc, o)
	return svc
}

func TestAllocatesLowestFreeAndCounts(t *testing.T) {
	s := NewState(true)
	pools := []*ciliumv2.CiliumLoadBalancerIPPool{mkPool("p", 0, "192.0.2.0/30")}
	svcs := []*corev1.Service{mkSvc("a", 1), mkSvc("b", 2)}
	out := s.Reconcile(pools, nil, svcs)
	if got := ips(svcOutcome(t, out, "a")); got != "192.0.2.0" {
		t.Errorf("a got %q, want 192.0.2.0", got)
	}
	if got := ips(svcOutcome(t, out, "b")); got != "192.0.2.1" {
		t.Errorf("b got %q, want 192.0.2.1", got)
	}
	o := svcOutcome(t, out, "a")
	if !o.Satisfied || o.Reason != reasonSatisfied {
		t.Errorf("a: %+v, want satisfied", o)
	}
	po := poolOutcome(t, out, "p")
	if po.Total != 4 || po.Used != 2 || po.Available != 2 {
		t.Errorf("counts %d/%d/%d, want total 4 used 2 available 2", po.Total, po.Used, po.Available)
	}

	// Stable: a second pass changes nothing.
	out = s.Reconcile(pools, nil, svcs)
	if got := ips(svcOutcome(t, out, "b")); got != "192.0.2.1" {
		t.Errorf("second pass: b got %q", got)
	}
}

func TestExhaustion(t *testing.T) {
	s := NewState(true)
	pools := []*ciliumv2.CiliumLoadBalancerIPPool{mkPool("p", 0, "192.0.2.10-192.0.2.11")}
	svcs := []*corev1.Service{mkSvc("a", 1), mkSvc("b", 2), mkSvc("c", 3)}
	out := s.Reconcile(pools, nil, svcs)
	c := svcOutcome(t, out, "c")
	if c.Satisfied || c.Reason != reasonOutOfIPs || len(c.IPs) != 0 {
		t.Fatalf("c: %+v, want out_of_ips without address", c)
	}
	if po := poolOutcome(t, out, "p"); po.Available != 0 || po.Used != 2 {
		t.Errorf("counts %+v", po)
	}
	// Deleting a releases its address to c.
	out = s.Reconcile(pools, nil, svcs[1:])
	if got := out.Released["ns/a"]; len(got) != 1 || got[0].String() != "192.0.2.10" {
		t.Errorf("released %v", out.Released)
	}
	if got := ips(svcOutcome(t, out, "c")); got != "192.0.2.10" {
		t.Errorf("c got %q after a's deletion, want 192.0.2.10", got)
	}
}

func TestRequestedIPs(t *testing.T) {
	s := NewState(true)
	pools := []*ciliumv2.CiliumLoadBalancerIPPool{mkPool("p", 0, "192.0.2.0/24")}
	a := mkSvc("a", 1)
	a.Spec.LoadBalancerIP = "192.0.2.77"
	b := mkSvc("b", 2)
	b.Annotations = map[string]string{ciliumv2.LBIPAMIPsAnnotation: "192.0.2.77"}
	c := mkSvc("c", 3)
	c.Annotations = map[string]string{ciliumv2.LBIPAMIPsAnnotationAlias: "198.51.100.1"}
	d := mkSvc("d", 4)
	out := s.Reconcile(pools, nil, []*corev1.Service{a, b, c, d})
	if got := ips(svcOutcome(t, out, "a")); got != "192.0.2.77" {
		t.Errorf("a got %q", got)
	}
	if o := svcOutcome(t, out, "b"); o.Satisfied || o.Reason != reasonAlreadyAlloc {
		t.Errorf("b: %+v, want already_allocated", o)
	}
	if o := svcOutcome(t, out, "c"); o.Satisfied || o.Reason != reasonNoPool || !strings.Contains(o.Message, "198.51.100.1") {
		t.Errorf("c: %+v, want no_pool naming the address", o)
	}
	if got := ips(svcOutcome(t, out, "d")); got != "192.0.2.0" {
		t.Errorf("d got %q", got)
	}
}

func TestSelectorAndClass(t *testing.T) {
	s := NewState(true)
	p := mkPool("blue", 0, "192.0.2.0/28")
	p.Spec.ServiceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"color": "blue"}}
	byName := mkPool("named", 1, "198.51.100.0/28")
	byName.Spec.ServiceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{ciliumv2.ServiceNameLabel: "special"}}
	blue := mkSvc("blue", 1)
	blue.Labels = map[string]string{"color": "blue"}
	red := mkSvc("red", 2)
	special := mkSvc("special", 3)
	classed := mkSvc("classed", 4)
	cls := "io.cilium/bgp-control-plane"
	classed.Spec.LoadBalancerClass = &cls
	out := s.Reconcile([]*ciliumv2.CiliumLoadBalancerIPPool{p, byName}, nil, []*corev1.Service{blue, red, special, classed})
	if got := ips(svcOutcome(t, out, "blue")); got != "192.0.2.0" {
		t.Errorf("blue got %q", got)
	}
	if o := svcOutcome(t, out, "red"); o.Satisfied || o.Reason != reasonNoPool {
		t.Errorf("red: %+v, want no_pool", o)
	}
	if got := ips(svcOutcome(t, out, "special")); got != "198.51.100.0" {
		t.Errorf("special got %q", got)
	}
	for _, o := range out.Services {
		if o.Service.Name == "classed" {
			t.Errorf("a Service with a loadBalancerClass got an outcome: %+v", o)
		}
	}
	// --default-lb-service-ipam=none: nobody's.
	out = NewState(false).Reconcile([]*ciliumv2.CiliumLoadBalancerIPPool{p}, nil, []*corev1.Service{blue})
	if len(out.Services) != 0 {
		t.Errorf("default none: outcomes %+v", out.Services)
	}
}

func TestTypeChangeReleases(t *testing.T) {
	s := NewState(true)
	pools := []*ciliumv2.CiliumLoadBalancerIPPool{mkPool("p", 0, "192.0.2.0/30")}
	a := mkSvc("a", 1)
	out := s.Reconcile(pools, nil, []*corev1.Service{a})
	a = withStatus(a, svcOutcome(t, out, "a"))
	a.Spec.Type = corev1.ServiceTypeClusterIP
	out = s.Reconcile(pools, nil, []*corev1.Service{a})
	o := svcOutcome(t, out, "a")
	if o.Responsible {
		t.Fatalf("a still LB IPAM's: %+v", o)
	}
	st := serviceStatus(a, o)
	if len(st.LoadBalancer.Ingress) != 0 || len(st.Conditions) != 0 {
		t.Errorf("status after the type change: %+v", st)
	}
	if held := s.Owners(netip.MustParseAddr("192.0.2.0")); len(held) > 0 {
		t.Error("address still held")
	}
}

func TestFirstLastAndConflicts(t *testing.T) {
	s := NewState(true)
	old := mkPool("old", 0, "192.0.2.0/29")
	old.Spec.AllowFirstLastIPs = ciliumv2.AllowFirstLastIPNo
	newer := mkPool("newer", 5, "192.0.2.4/30")
	self := mkPool("self", 6, "198.51.100.0/29", "198.51.100.4-198.51.100.5")
	out := s.Reconcile([]*ciliumv2.CiliumLoadBalancerIPPool{newer, old, self}, nil, []*corev1.Service{mkSvc("a", 1)})
	if got := ips(svcOutcome(t, out, "a")); got != "192.0.2.1" {
		t.Errorf("a got %q, want 192.0.2.1 (first address reserved)", got)
	}
	if po := poolOutcome(t, out, "old"); po.Conflict != "" || po.Total != 8 || po.Used != 3 || po.Available != 5 {
		t.Errorf("old: %+v", po)
	}
	if po := poolOutcome(t, out, "newer"); !strings.Contains(po.Conflict, "from IP Pool 'old'") {
		t.Errorf("newer conflict %q", po.Conflict)
	}
	if po := poolOutcome(t, out, "self"); po.Conflict == "" {
		t.Error("a pool overlapping itself is not conflicting")
	}
	// Deleting the old pool resolves the newer one's conflict, and takes
	// a's address back; a gets one from the newer pool.
	out = s.Reconcile([]*ciliumv2.CiliumLoadBalancerIPPool{newer}, nil, []*corev1.Service{mkSvc("a", 1)})
	if po := poolOutcome(t, out, "newer"); po.Conflict != "" {
		t.Errorf("newer still conflicting: %q", po.Conflict)
	}
	if got := ips(svcOutcome(t, out, "a")); got != "192.0.2.4" {
		t.Errorf("a got %q after the old pool's deletion, want 192.0.2.4", got)
	}
}

func TestPodCIDROverlapWithheld(t *testing.T) {
	s := NewState(true)
	pools := []*ciliumv2.CiliumLoadBalancerIPPool{mkPool("p", 0, "10.0.1.0/23")}
	cidrs := []PodCIDR{{Node: "n1", Prefix: netip.MustParsePrefix("10.0.1.0/24")}}
	req := mkSvc("req", 2)
	req.Spec.LoadBalancerIP = "10.0.1.5"
	out := s.Reconcile(pools, cidrs, []*corev1.Service{mkSvc("a", 1), req})
	if got := ips(svcOutcome(t, out, "a")); got != "10.0.0.0" {
		t.Errorf("a got %q, want 10.0.0.0 (10.0.1.0/24 is node n1's)", got)
	}
	if o := svcOutcome(t, out, "req"); o.Satisfied || !strings.Contains(o.Message, "pod CIDR") {
		t.Errorf("req: %+v, want refused naming the pod CIDR", o)
	}
	po := poolOutcome(t, out, "p")
	if !strings.Contains(po.PodCIDROverlap, "10.0.1.0/24 of node n1") || po.Total != 512 || po.Used != 257 || po.Available != 255 {
		t.Errorf("pool: %+v", po)
	}
	// A Service holding an address that becomes a pod CIDR's loses it.
	s2 := NewState(true)
	out = s2.Reconcile(pools, nil, []*corev1.Service{mkSvc("b", 1)})
	b := withStatus(mkSvc("b", 1), svcOutcome(t, out, "b"))
	out = s2.Reconcile(pools, []PodCIDR{{Node: "n2", Prefix: netip.MustParsePrefix("10.0.0.0/24")}}, []*corev1.Service{b})
	if got := ips(svcOutcome(t, out, "b")); got != "10.0.1.0" {
		t.Errorf("b got %q once 10.0.0.0/24 is a pod CIDR, want 10.0.1.0", got)
	}
}

func TestRestartImportsStatus(t *testing.T) {
	pools := []*ciliumv2.CiliumLoadBalancerIPPool{mkPool("p", 0, "192.0.2.0/24")}
	s := NewState(true)
	var svcs []*corev1.Service
	for i := range 5 {
		svcs = append(svcs, mkSvc(fmt.Sprintf("s%d", i), i))
	}
	out := s.Reconcile(pools, nil, svcs)
	// Free one address in the middle, so a fresh allocator would hand
	// out different ones.
	var after []*corev1.Service
	want := map[string]string{}
	for _, svc := range svcs {
		if svc.Name == "s1" {
			continue
		}
		o := svcOutcome(t, out, svc.Name)
		after = append(after, withStatus(svc, o))
		want[svc.Name] = ips(o)
	}
	// A new Service, older than nothing, whose status lists s2's address
	// (written by someone else): it must not take it.
	thief := mkSvc("thief", 10)
	thief.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: want["s2"]}}
	after = append(after, thief)
	rand.Shuffle(len(after), func(i, j int) { after[i], after[j] = after[j], after[i] })

	fresh := NewState(true)
	out = fresh.Reconcile(pools, nil, after)
	for name, w := range want {
		if got := ips(svcOutcome(t, out, name)); got != w {
			t.Errorf("after restart %s has %q, want %q", name, got, w)
		}
	}
	if got := ips(svcOutcome(t, out, "thief")); got != "192.0.2.1" {
		t.Errorf("thief got %q, want the free 192.0.2.1", got)
	}
}

// TestNeverTwoHolders creates, deletes and changes Services (some with
// sharing keys, ports and traffic policies that may or may not let them
// share) and pools at random, with a restart now and then, and checks
// after every pass that an address in two Services' outcomes is one they
// may share, and that the state holds nothing the outcomes do not show.
func TestNeverTwoHolders(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	allPools := []*ciliumv2.CiliumLoadBalancerIPPool{
		mkPool("a", 0, "192.0.2.0/28"), mkPool("b", 1, "192.0.2.8/29"), mkPool("c", 2, "192.0.2.16-192.0.2.20"),
	}
	s := NewState(true)
	svcs := map[string]*corev1.Service{}
	shared := 0
	for step := range 3000 {
		switch r.IntN(7) {
		case 0, 1:
			name := fmt.Sprintf("s%d", r.IntN(40))
			if svcs[name] == nil {
				svc := mkSvc(name, step)
				if r.IntN(4) == 0 {
					svc.Spec.LoadBalancerIP = fmt.Sprintf("192.0.2.%d", r.IntN(24))
				}
				if r.IntN(2) == 0 {
					svc.Annotations = map[string]string{ciliumv2.LBIPAMSharingKeyAnnotation: fmt.Sprintf("k%d", r.IntN(2))}
				}
				svc.Spec.Ports = []corev1.ServicePort{{Port: int32(80 + r.IntN(4)), Protocol: corev1.ProtocolTCP}}
				svcs[name] = svc
			}
		case 2:
			delete(svcs, fmt.Sprintf("s%d", r.IntN(40)))
		case 3:
			// A change that may make two sharing Services incompatible.
			if svc := svcs[fmt.Sprintf("s%d", r.IntN(40))]; svc != nil {
				svc = svc.DeepCopy()
				svc.Spec.Ports[0].Port = int32(80 + r.IntN(4))
				if r.IntN(3) == 0 {
					svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
				}
				svcs[svc.Name] = svc
			}
		case 4:
			if r.IntN(10) == 0 {
				s = NewState(true) // restart
			}
		}
		var pools []*ciliumv2.CiliumLoadBalancerIPPool
		for _, p := range allPools {
			if r.IntN(5) != 0 {
				pools = append(pools, p)
			}
		}
		var list []*corev1.Service
		for _, svc := range svcs {
			list = append(list, svc)
		}
		out := s.Reconcile(pools, nil, list)
		seen := map[netip.Addr][]*corev1.Service{}
		for _, o := range out.Services {
			for _, a := range o.IPs {
				for _, other := range seen[a] {
					if ok, why := sharable(o.Service, other); !ok {
						t.Fatalf("step %d: %s held by %s and %s, which may not share it: %s", step, a, other.Name, o.Service.Name, why)
					}
					shared++
				}
				seen[a] = append(seen[a], o.Service)
			}
			svcs[o.Service.Name] = withStatus(o.Service, o)
		}
		for a, keys := range s.owner {
			if len(keys) != len(seen[a]) {
				t.Fatalf("step %d: %s owned by %v but in %d outcomes", step, a, keys, len(seen[a]))
			}
		}
	}
	if shared == 0 {
		t.Fatal("no address was ever shared: the test does not exercise sharing")
	}
	t.Logf("%d shared holdings checked", shared)
}

func TestSharingKey(t *testing.T) {
	s := NewState(true)
	pools := []*ciliumv2.CiliumLoadBalancerIPPool{mkPool("p", 0, "192.0.2.0/24")}
	web := func(name string, age int, key string, port int32) *corev1.Service {
		svc := mkSvc(name, age)
		if key != "" {
			svc.Annotations = map[string]string{ciliumv2.LBIPAMSharingKeyAnnotation: key}
		}
		svc.Spec.Ports = []corev1.ServicePort{{Port: port, Protocol: corev1.ProtocolTCP}}
		return svc
	}
	http := web("http", 1, "front", 80)
	https := web("https", 2, "front", 443)
	clash := web("clash", 3, "front", 80)
	other := web("other", 4, "back", 443)
	plain := web("plain", 5, "", 8080)
	out := s.Reconcile(pools, nil, []*corev1.Service{http, https, clash, other, plain})
	for name, want := range map[string]string{"http": "192.0.2.0", "https": "192.0.2.0", "clash": "192.0.2.1", "other": "192.0.2.2", "plain": "192.0.2.3"} {
		if got := ips(svcOutcome(t, out, name)); got != want {
			t.Errorf("%s got %q, want %s", name, got, want)
		}
	}
	// Another namespace may share only if both allow it.
	s2 := NewState(true)
	a := web("a", 1, "k", 80)
	b := web("b", 2, "k", 443)
	b.Namespace = "other"
	out = s2.Reconcile(pools, nil, []*corev1.Service{a, b})
	if ips(svcOutcome(t, out, "b")) == ips(svcOutcome(t, out, "a")) {
		t.Error("a Service of another namespace shares without permission")
	}
	a.Annotations[ciliumv2.LBIPAMSharingCrossNamespaceAnnotation] = "other"
	b.Annotations[ciliumv2.LBIPAMSharingCrossNamespaceAnnotation] = "*"
	out = NewState(true).Reconcile(pools, nil, []*corev1.Service{a, b})
	if ips(svcOutcome(t, out, "b")) != ips(svcOutcome(t, out, "a")) {
		t.Error("Services of two namespaces that allow each other do not share")
	}
	// A requested address held by an incompatible Service.
	req := web("req", 9, "front", 443)
	req.Spec.LoadBalancerIP = "192.0.2.0"
	out = s.Reconcile(pools, nil, []*corev1.Service{http, https, clash, other, plain, req})
	if o := svcOutcome(t, out, "req"); o.Satisfied || o.Reason != reasonAlreadyAllocIncompatible || !strings.Contains(o.Message, "same port and protocol") {
		t.Errorf("req: %+v", o)
	}
	// https changes its port to 80: it may no longer share with the older
	// http and gets an address of its own; http keeps its.
	https2 := https.DeepCopy()
	https2.Spec.Ports[0].Port = 80
	out = s.Reconcile(pools, nil, []*corev1.Service{http, https2, clash, other, plain})
	if got := ips(svcOutcome(t, out, "http")); got != "192.0.2.0" {
		t.Errorf("http got %q", got)
	}
	if got := ips(svcOutcome(t, out, "https")); got == "192.0.2.0" || got == "" {
		t.Errorf("https got %q, want an address of its own", got)
	}
}

func TestRangeHelpers(t *testing.T) {
	if r := prefixRange(netip.MustParsePrefix("192.0.2.0/30")); r.String() != "192.0.2.0/30" || r.size() != 4 {
		t.Errorf("range %s size %d", r, r.size())
	}
	m := mergeRanges([]ipRange{prefixRange(netip.MustParsePrefix("10.0.0.0/25")), prefixRange(netip.MustParsePrefix("10.0.0.128/25")), prefixRange(netip.MustParsePrefix("10.0.0.64/26"))})
	if len(m) != 1 || m[0].String() != "10.0.0.0/24" {
		t.Errorf("merged %v", m)
	}
	if !slices.Equal(requestedIPs(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{ciliumv2.LBIPAMIPsAnnotation: "192.0.2.1, 192.0.2.2,bad,192.0.2.1"}}}),
		[]netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")}) {
		t.Error("requestedIPs")
	}
}
