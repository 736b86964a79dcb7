package lb

import (
	"maps"
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// sessionAffinity ClientIP reaches every frontend of the Service, with
// the configured timeout or the API server's default; None (or unset)
// and changes of it alone make a frontend differ (SameAs).
func TestServiceFrontendsSessionAffinity(t *testing.T) {
	timeout := int32(2)
	for _, tc := range []struct {
		name     string
		affinity corev1.ServiceAffinity
		config   *corev1.SessionAffinityConfig
		want     bool
		timeout  uint32
	}{
		{name: "unset"},
		{name: "None", affinity: corev1.ServiceAffinityNone},
		{name: "ClientIP default", affinity: corev1.ServiceAffinityClientIP, want: true, timeout: 10800},
		{name: "ClientIP config without timeout", affinity: corev1.ServiceAffinityClientIP,
			config: &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{}}, want: true, timeout: 10800},
		{name: "ClientIP 2s", affinity: corev1.ServiceAffinityClientIP,
			config: &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &timeout}}, want: true, timeout: 2},
		{name: "None with a config", affinity: corev1.ServiceAffinityNone,
			config: &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &timeout}}},
	} {
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s"}, Spec: corev1.ServiceSpec{
			ClusterIP: "10.96.0.20", SessionAffinity: tc.affinity, SessionAffinityConfig: tc.config,
			Ports: []corev1.ServicePort{{Name: "a", Port: 80}, {Name: "b", Port: 53, Protocol: corev1.ProtocolUDP}},
		}}
		fes := ServiceFrontends(svc, nil)
		if len(fes) != 2 {
			t.Fatalf("%s: %d frontends, want 2", tc.name, len(fes))
		}
		for _, f := range fes {
			if f.SessionAffinity != tc.want || f.AffinityTimeout != tc.timeout {
				t.Errorf("%s: %v affinity %v %ds, want %v %ds", tc.name, f.Address, f.SessionAffinity, f.AffinityTimeout, tc.want, tc.timeout)
			}
		}
	}
	a := &Frontend{Service: "ns/s"}
	b := *a
	b.SessionAffinity, b.AffinityTimeout = true, 10800
	if a.SameAs(&b) {
		t.Error("SameAs ignores session affinity")
	}
	c := b
	c.AffinityTimeout = 2
	if b.SameAs(&c) {
		t.Error("SameAs ignores the affinity timeout")
	}
}

// Without kube-proxy replacement a NodePort Service with externalIPs and
// a LoadBalancer IP has its ClusterIP frontend only, traffic policies are
// ignored and a terminating endpoint is never used; with it, the node's
// addresses, 0.0.0.0, the ingress IP and the externalIP are frontends,
// and internalTrafficPolicy Local with externalTrafficPolicy Cluster
// gives the external scope every ready backend and the internal scope
// this node's (TwoScopes, not Local).
func TestDeriveFrontendsKubeProxyReplacement(t *testing.T) {
	local := corev1.ServiceInternalTrafficPolicyLocal
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s"}, Spec: corev1.ServiceSpec{
		Type: corev1.ServiceTypeLoadBalancer, ClusterIP: "10.96.0.20", ExternalIPs: []string{"198.51.100.7", "2001:db8::1"},
		InternalTrafficPolicy: &local,
		Ports:                 []corev1.ServicePort{{Name: "a", Port: 80, NodePort: 30080}},
	}}
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "172.16.0.10"}, {Hostname: "lb.example"}}
	yes, no := true, false
	n1, n2 := "node1", "node2"
	port, name := int32(8080), "a"
	sl := &discoveryv1.EndpointSlice{AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{{Name: &name, Port: &port}},
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.0.1.1"}, NodeName: &n1, Conditions: discoveryv1.EndpointConditions{Ready: &yes}},
			{Addresses: []string{"10.0.2.1"}, NodeName: &n2, Conditions: discoveryv1.EndpointConditions{Ready: &yes}},
			{Addresses: []string{"10.0.1.9"}, NodeName: &n1, Conditions: discoveryv1.EndpointConditions{Ready: &no, Serving: &yes, Terminating: &yes}},
		}}
	be := func(s string) L4Addr { return L4Addr{Addr: netip.MustParseAddr(s), Port: 8080, Proto: TCP} }

	off := DeriveFrontends(svc, []*discoveryv1.EndpointSlice{sl}, Options{NodeName: n1, NodeAddrs: []netip.Addr{netip.MustParseAddr("192.168.56.11")}})
	if len(off) != 1 || off[0].TypeName() != TypeClusterIP || !slices.Equal(off[0].Backends, []L4Addr{be("10.0.1.1"), be("10.0.2.1")}) {
		t.Fatalf("without KPR: %+v", off)
	}

	on := DeriveFrontends(svc, []*discoveryv1.EndpointSlice{sl}, Options{KubeProxyReplacement: true, NodeName: n1,
		NodeAddrs: []netip.Addr{netip.MustParseAddr("192.168.56.11"), netip.MustParseAddr("fd00::11")}})
	got := map[string]*Frontend{}
	for _, f := range on {
		got[f.Address.String()] = f
	}
	want := map[string]string{"10.96.0.20:80/TCP": TypeClusterIP, "0.0.0.0:30080/TCP": TypeNodePort,
		"192.168.56.11:30080/TCP": TypeNodePort, "172.16.0.10:80/TCP": TypeLoadBalancer, "198.51.100.7:80/TCP": TypeExternalIP}
	if len(got) != len(want) {
		t.Errorf("frontends %v, want %v", slices.Collect(maps.Keys(got)), want)
	}
	for a, typ := range want {
		f := got[a]
		if f == nil || f.Type != typ {
			t.Errorf("%s: %+v, want type %s", a, f, typ)
			continue
		}
		if typ == TypeClusterIP {
			// internalTrafficPolicy Local: this node's only.
			if f.TwoScopes || !slices.Equal(f.Backends, []L4Addr{be("10.0.1.1")}) {
				t.Errorf("%s: %+v, want node1's backend only", a, f)
			}
			continue
		}
		if f.Local || !f.TwoScopes || !f.NodePort() || !slices.Equal(f.Backends, []L4Addr{be("10.0.1.1"), be("10.0.2.1")}) ||
			!slices.Equal(f.IntBackends, []L4Addr{be("10.0.1.1")}) {
			t.Errorf("%s: %+v, want every backend outside, node1's inside", a, f)
		}
	}
}

// A pod's hostPorts: on the node's addresses and 0.0.0.0 or on the
// hostIP, to the pod's address; none for hostNetwork, a pod without an
// IPv4 address, a finished pod, or a port without hostPort.
func TestPodHostPortFrontends(t *testing.T) {
	pod := func(mut func(*corev1.Pod)) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Ports: []corev1.ContainerPort{
				{ContainerPort: 80, HostPort: 8080}, {ContainerPort: 53, Protocol: corev1.ProtocolUDP, HostPort: 53, HostIP: "192.168.56.11"},
				{ContainerPort: 9090}}}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: "fd00::5"}, {IP: "10.0.1.5"}}}}
		if mut != nil {
			mut(p)
		}
		return p
	}
	o := Options{NodeAddrs: []netip.Addr{netip.MustParseAddr("192.168.56.11"), netip.MustParseAddr("203.0.113.11")}}
	var got []string
	for _, f := range PodHostPortFrontends(pod(nil), o) {
		if f.Type != TypeHostPort || !f.Local || !f.NodePort() || f.Service != "ns/p/host-port" || len(f.Backends) != 1 {
			t.Errorf("frontend %+v", f)
			continue
		}
		got = append(got, f.Address.String()+" "+f.Backends[0].String())
	}
	want := []string{"0.0.0.0:8080/TCP 10.0.1.5:80/TCP", "192.168.56.11:53/UDP 10.0.1.5:53/UDP",
		"192.168.56.11:8080/TCP 10.0.1.5:80/TCP", "203.0.113.11:8080/TCP 10.0.1.5:80/TCP"}
	if !slices.Equal(got, want) {
		t.Errorf("frontends %q, want %q", got, want)
	}
	for name, mut := range map[string]func(*corev1.Pod){
		"hostNetwork": func(p *corev1.Pod) { p.Spec.HostNetwork = true },
		"no IPv4":     func(p *corev1.Pod) { p.Status.PodIPs = p.Status.PodIPs[:1] },
		"succeeded":   func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded },
		"deleted":     func(p *corev1.Pod) { now := metav1.Now(); p.DeletionTimestamp = &now },
	} {
		if fes := PodHostPortFrontends(pod(mut), o); len(fes) != 0 {
			t.Errorf("%s: %d frontends, want none", name, len(fes))
		}
	}
}

// Which endpoints pickBackends uses, as kube-proxy: ready ones (also a
// terminating one the slice calls ready, which the EndpointSlice
// controller does only for a Service with publishNotReadyAddresses: the
// e2e spec "should be able to connect to terminating and unready endpoints
// if PublishNotReadyAddresses is true"); serving terminating ones only when
// none is ready; never one neither ready nor serving.
func TestPickBackendsConditions(t *testing.T) {
	yes, no := true, false
	port, name := int32(8080), "a"
	ep := func(addr string, c discoveryv1.EndpointConditions) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{Addresses: []string{addr}, Conditions: c}
	}
	be := func(s string) L4Addr { return L4Addr{Addr: netip.MustParseAddr(s), Port: 8080, Proto: TCP} }
	for _, c := range []struct {
		name string
		eps  []discoveryv1.Endpoint
		want []L4Addr
	}{
		{"ready, unset counts as ready", []discoveryv1.Endpoint{
			ep("10.0.0.1", discoveryv1.EndpointConditions{Ready: &yes}), ep("10.0.0.2", discoveryv1.EndpointConditions{}),
			ep("10.0.0.3", discoveryv1.EndpointConditions{Ready: &no, Serving: &no})},
			[]L4Addr{be("10.0.0.1"), be("10.0.0.2")}},
		{"publishNotReadyAddresses: ready, not serving, terminating", []discoveryv1.Endpoint{
			ep("10.0.0.4", discoveryv1.EndpointConditions{Ready: &yes, Serving: &no, Terminating: &yes})},
			[]L4Addr{be("10.0.0.4")}},
		{"serving terminating only without ready ones", []discoveryv1.Endpoint{
			ep("10.0.0.1", discoveryv1.EndpointConditions{Ready: &yes}),
			ep("10.0.0.5", discoveryv1.EndpointConditions{Ready: &no, Serving: &yes, Terminating: &yes})},
			[]L4Addr{be("10.0.0.1")}},
		{"fallback to serving terminating", []discoveryv1.Endpoint{
			ep("10.0.0.5", discoveryv1.EndpointConditions{Ready: &no, Serving: &yes, Terminating: &yes}),
			ep("10.0.0.6", discoveryv1.EndpointConditions{Ready: &no, Serving: &no, Terminating: &yes})},
			[]L4Addr{be("10.0.0.5")}},
	} {
		sl := &discoveryv1.EndpointSlice{AddressType: discoveryv1.AddressTypeIPv4,
			Ports: []discoveryv1.EndpointPort{{Name: &name, Port: &port}}, Endpoints: c.eps}
		if got := pickBackends([]*discoveryv1.EndpointSlice{sl}, name, TCP, "", false); !slices.Equal(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// Services another proxy serves (service.kubernetes.io/service-proxy-name
// other than ours) and Services labelled service.kubernetes.io/headless
// get no frontend, as with kube-proxy and Cilium; with
// --k8s-service-proxy-name set, only the Services naming it.
func TestDeriveFrontendsServiceProxyName(t *testing.T) {
	svc := func(labels map[string]string) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s", Labels: labels},
			Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.30", Ports: []corev1.ServicePort{{Port: 80}}}}
	}
	for _, c := range []struct {
		labels map[string]string
		proxy  string
		want   int
	}{
		{nil, "", 1},
		{map[string]string{LabelServiceProxyName: "foo-bar"}, "", 0},
		{map[string]string{LabelServiceProxyName: ""}, "", 1},
		{map[string]string{LabelHeadless: ""}, "", 0},
		{map[string]string{LabelServiceProxyName: "cellium"}, "cellium", 1},
		{nil, "cellium", 0},
		{map[string]string{LabelServiceProxyName: "cellium", LabelHeadless: ""}, "cellium", 0},
	} {
		for _, kpr := range []bool{false, true} {
			got := DeriveFrontends(svc(c.labels), nil, Options{KubeProxyReplacement: kpr, ServiceProxyName: c.proxy})
			if len(got) != c.want {
				t.Errorf("labels %v, --k8s-service-proxy-name=%q, kpr %v: %d frontends, want %d", c.labels, c.proxy, kpr, len(got), c.want)
			}
		}
	}
	// A slice labelled service.kubernetes.io/headless is not read (the
	// e2e spec "should implement service.kubernetes.io/headless" labels a
	// selectorless Service's slice).
	port := int32(8080)
	slice := func(labels map[string]string, addr string) *discoveryv1.EndpointSlice {
		return &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Labels: labels}, AddressType: discoveryv1.AddressTypeIPv4,
			Ports: []discoveryv1.EndpointPort{{Port: &port}}, Endpoints: []discoveryv1.Endpoint{{Addresses: []string{addr}}}}
	}
	for _, kpr := range []bool{false, true} {
		got := DeriveFrontends(svc(nil), []*discoveryv1.EndpointSlice{slice(nil, "10.0.0.1"), slice(map[string]string{LabelHeadless: ""}, "10.0.0.2")},
			Options{KubeProxyReplacement: kpr})
		if len(got) != 1 || !slices.Equal(got[0].Backends, []L4Addr{{Addr: netip.MustParseAddr("10.0.0.1"), Port: 8080, Proto: TCP}}) {
			t.Errorf("kpr %v: %+v, want the unlabelled slice's backend only", kpr, got)
		}
	}
}
