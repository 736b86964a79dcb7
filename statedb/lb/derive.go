package lb

import (
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// Options are what deriving a Service's frontends needs beyond the
// Service and its EndpointSlices.
type Options struct {
	// KubeProxyReplacement (--kube-proxy-replacement) derives the
	// NodePort, LoadBalancer and externalIP frontends too, applies the
	// traffic policies and falls back to terminating endpoints.
	KubeProxyReplacement bool
	// NodeName is this node's name: an endpoint whose nodeName it is is
	// local (traffic policy Local).
	NodeName string
	// NodeAddrs are the IPv4 addresses of this node a NodePort is served
	// on; 0.0.0.0, the frontend the socket programs use for the node's
	// loopback, is added to them.
	NodeAddrs []netip.Addr
	// SourceRangeCheck (--enable-svc-source-range-check, with
	// KubeProxyReplacement) gives the LoadBalancer and externalIP
	// frontends of a LoadBalancer Service its loadBalancerSourceRanges;
	// SourceRangeAllTypes (--bpf-lb-source-range-all-types) its NodePort
	// frontends too.
	SourceRangeCheck    bool
	SourceRangeAllTypes bool
	// ServiceProxyName (--k8s-service-proxy-name) is the
	// service.kubernetes.io/service-proxy-name of the Services this node
	// serves; empty: the Services without that label.
	ServiceProxyName string
}

// servedSlices are the slices without the service.kubernetes.io/headless
// label, which proxies leave alone (kube-proxy and Cilium do not watch
// them). sls itself when every slice is served (no copy).
func servedSlices(sls []*discoveryv1.EndpointSlice) []*discoveryv1.EndpointSlice {
	headless := func(sl *discoveryv1.EndpointSlice) bool {
		_, ok := sl.Labels[LabelHeadless]
		return ok
	}
	if !slices.ContainsFunc(sls, headless) {
		return sls
	}
	return slices.DeleteFunc(slices.Clone(sls), headless)
}

// Labels that hand a Service to another proxy, or tell proxies to leave
// it alone (as kube-proxy and Cilium read them).
const (
	LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"
	LabelHeadless         = "service.kubernetes.io/headless"
)

// Served reports whether a proxy with o serves svc: not when svc has
// the service.kubernetes.io/headless label (nor does it read slices with
// it), nor when its
// service.kubernetes.io/service-proxy-name differs from
// o.ServiceProxyName (absent and empty are the same).
func (o Options) Served(svc *corev1.Service) bool {
	if _, ok := svc.Labels[LabelHeadless]; ok {
		return false
	}
	return svc.Labels[LabelServiceProxyName] == o.ServiceProxyName
}

// ServiceFrontends returns the ClusterIP frontends of svc with their
// backends from slices, as DeriveFrontends without kube-proxy
// replacement.
func ServiceFrontends(svc *corev1.Service, slices_ []*discoveryv1.EndpointSlice) []*Frontend {
	return DeriveFrontends(svc, slices_, Options{})
}

// DeriveFrontends returns the frontends of svc with their backends from
// slices (the Service's EndpointSlices), sorted by address, without
// backend IDs and status:
//
//   - one frontend per IPv4 ClusterIP (spec.clusterIPs) and TCP or UDP
//     port; headless Services, ExternalName Services, IPv6 and SCTP have
//     none, and neither has a Service another proxy serves (o.Served);
//   - with o.KubeProxyReplacement also, per port, a NodePort frontend
//     (type NodePort or LoadBalancer, nodePort set) on each of
//     o.NodeAddrs and on 0.0.0.0, a LoadBalancer frontend on each IPv4
//     status.loadBalancer.ingress[].ip and an ExternalIP frontend on each
//     IPv4 spec.externalIPs; without it these have none (socket LB
//     translates ClusterIPs only, kube-proxy does the rest);
//   - a frontend's backends are the addresses of the IPv4 slices'
//     endpoints that are ready (conditions.ready unset counts as ready),
//     with the port of the slice port of the same name and protocol.
//     With o.KubeProxyReplacement, as kube-proxy: when none is ready, the
//     serving and terminating ones; internalTrafficPolicy Local keeps a
//     ClusterIP's to this node's (o.NodeName); externalTrafficPolicy
//     Local keeps the other frontends' to this node's (Local) and, when
//     the two policies differ, the frontend gets the internal policy's
//     backends as IntBackends for clients in the cluster (TwoScopes);
//   - with o.KubeProxyReplacement and o.SourceRangeCheck, a LoadBalancer
//     Service's spec.loadBalancerSourceRanges (IPv4, masked, sorted,
//     unique; unparsable ones ignored, as Cilium) go to its LoadBalancer
//     and ExternalIP frontends, and with o.SourceRangeAllTypes to its
//     NodePort frontends as well; never to a ClusterIP (clients inside
//     the cluster are not restricted, as in Cilium);
//   - sessionAffinity ClientIP gives every frontend session affinity
//     with sessionAffinityConfig.clientIP.timeoutSeconds (10800 when
//     unset, as the API server defaults it).
func DeriveFrontends(svc *corev1.Service, slices_ []*discoveryv1.EndpointSlice, o Options) []*Frontend {
	if svc == nil || svc.Spec.Type == corev1.ServiceTypeExternalName || !o.Served(svc) {
		return nil
	}
	slices_ = servedSlices(slices_)
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 && svc.Spec.ClusterIP != "" {
		ips = []string{svc.Spec.ClusterIP}
	}
	name := svc.Namespace + "/" + svc.Name
	affinity, timeout := sessionAffinity(svc)
	intLocal := svc.Spec.InternalTrafficPolicy != nil && *svc.Spec.InternalTrafficPolicy == corev1.ServiceInternalTrafficPolicyLocal
	extLocal := svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal
	var ranges []netip.Prefix
	if o.KubeProxyReplacement && o.SourceRangeCheck && svc.Spec.Type == corev1.ServiceTypeLoadBalancer {
		ranges = SourceRanges(svc.Spec.LoadBalancerSourceRanges)
	}
	var out []*Frontend
	seen := map[L4Addr]bool{}
	add := func(typ string, ip netip.Addr, port uint16, p corev1.ServicePort, proto uint8) {
		addr := L4Addr{Addr: ip, Port: port, Proto: proto}
		if seen[addr] {
			return
		}
		seen[addr] = true
		f := &Frontend{Address: addr, Type: typ, Service: name, PortName: p.Name,
			SessionAffinity: affinity, AffinityTimeout: timeout}
		switch {
		case !o.KubeProxyReplacement:
			f.Backends = portBackends(slices_, p.Name, proto)
		case typ == TypeClusterIP:
			f.Backends = pickBackends(slices_, p.Name, proto, o.NodeName, intLocal)
		default:
			f.Local = extLocal
			f.Backends = pickBackends(slices_, p.Name, proto, o.NodeName, extLocal)
			if extLocal != intLocal {
				f.TwoScopes = true
				f.IntBackends = pickBackends(slices_, p.Name, proto, o.NodeName, intLocal)
			}
			if typ != TypeNodePort || o.SourceRangeAllTypes {
				f.SourceRanges = ranges
			}
		}
		out = append(out, f)
	}
	parse4 := func(s string) (netip.Addr, bool) {
		ip, err := netip.ParseAddr(s)
		return ip, err == nil && ip.Is4()
	}
	for _, p := range svc.Spec.Ports {
		proto, ok := protoNumber(p.Protocol)
		if !ok || p.Port <= 0 || p.Port > 65535 {
			continue
		}
		for _, s := range ips {
			if ip, ok := parse4(s); ok { // not "None" (headless), IPv6
				add(TypeClusterIP, ip, uint16(p.Port), p, proto)
			}
		}
		if !o.KubeProxyReplacement {
			continue
		}
		if (svc.Spec.Type == corev1.ServiceTypeNodePort || svc.Spec.Type == corev1.ServiceTypeLoadBalancer) &&
			p.NodePort > 0 && p.NodePort <= 65535 {
			for _, ip := range append(slices.Clone(o.NodeAddrs), netip.IPv4Unspecified()) {
				if ip.Is4() {
					add(TypeNodePort, ip, uint16(p.NodePort), p, proto)
				}
			}
		}
		if svc.Spec.Type == corev1.ServiceTypeLoadBalancer {
			for _, ing := range svc.Status.LoadBalancer.Ingress {
				if ip, ok := parse4(ing.IP); ok {
					add(TypeLoadBalancer, ip, uint16(p.Port), p, proto)
				}
			}
		}
		for _, s := range svc.Spec.ExternalIPs {
			if ip, ok := parse4(s); ok {
				add(TypeExternalIP, ip, uint16(p.Port), p, proto)
			}
		}
	}
	slices.SortFunc(out, func(a, b *Frontend) int { return a.Address.Compare(b.Address) })
	return out
}

// SourceRanges parses loadBalancerSourceRanges: the IPv4 prefixes,
// masked, sorted and unique; others (IPv6, unparsable) are left out.
func SourceRanges(ss []string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil || !p.Addr().Is4() {
			continue
		}
		out = append(out, p.Masked())
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	return slices.Compact(out)
}

// sessionAffinity returns whether svc has ClientIP session affinity and
// its timeout in seconds.
func sessionAffinity(svc *corev1.Service) (bool, uint32) {
	if svc.Spec.SessionAffinity != corev1.ServiceAffinityClientIP {
		return false, 0
	}
	timeout := uint32(corev1.DefaultClientIPServiceAffinitySeconds)
	if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil && *c.ClientIP.TimeoutSeconds > 0 {
		timeout = uint32(*c.ClientIP.TimeoutSeconds)
	}
	return true, timeout
}

// portBackends returns the ready IPv4 endpoints of the slices for the
// slice port named name with protocol, sorted and unique.
func portBackends(eps []*discoveryv1.EndpointSlice, name string, proto uint8) []L4Addr {
	protocol := corev1.ProtocolTCP
	if proto == UDP {
		protocol = corev1.ProtocolUDP
	}
	var out []L4Addr
	for _, sl := range eps {
		if sl.AddressType != discoveryv1.AddressTypeIPv4 {
			continue
		}
		port, ok := slicePort(sl, name, protocol)
		if !ok {
			continue
		}
		for _, ep := range sl.Endpoints {
			if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				continue
			}
			for _, a := range ep.Addresses {
				ip, err := netip.ParseAddr(a)
				if err != nil || !ip.Is4() {
					continue
				}
				out = append(out, L4Addr{Addr: ip, Port: port, Proto: proto})
			}
		}
	}
	slices.SortFunc(out, L4Addr.Compare)
	return slices.Compact(out)
}

// pickBackends returns the IPv4 endpoints of the slices for the slice
// port named name with protocol, sorted and unique, as kube-proxy picks
// them: the ready ones (conditions.ready unset counts as ready; a
// terminating endpoint is ready only with publishNotReadyAddresses), or
// when there are none the serving (unset: as ready) and terminating ones;
// only those on node (nodeName) when local.
func pickBackends(eps []*discoveryv1.EndpointSlice, name string, proto uint8, node string, local bool) []L4Addr {
	protocol := corev1.ProtocolTCP
	if proto == UDP {
		protocol = corev1.ProtocolUDP
	}
	var ready, terminating []L4Addr
	for _, sl := range eps {
		if sl.AddressType != discoveryv1.AddressTypeIPv4 {
			continue
		}
		port, ok := slicePort(sl, name, protocol)
		if !ok {
			continue
		}
		for _, ep := range sl.Endpoints {
			if local && (ep.NodeName == nil || *ep.NodeName != node) {
				continue
			}
			c := ep.Conditions
			isReady := c.Ready == nil || *c.Ready
			isServing := isReady
			if c.Serving != nil {
				isServing = *c.Serving
			}
			isTerminating := c.Terminating != nil && *c.Terminating
			for _, a := range ep.Addresses {
				ip, err := netip.ParseAddr(a)
				if err != nil || !ip.Is4() {
					continue
				}
				b := L4Addr{Addr: ip, Port: port, Proto: proto}
				switch {
				case isReady:
					// Ready even while terminating: the slice says so only
					// for a Service with publishNotReadyAddresses.
					ready = append(ready, b)
				case isServing && isTerminating:
					terminating = append(terminating, b)
				}
			}
		}
	}
	out := ready
	if len(out) == 0 {
		out = terminating
	}
	slices.SortFunc(out, L4Addr.Compare)
	return slices.Compact(out)
}

// slicePort finds the port of the slice named name with protocol (a nil
// name or protocol means "" and TCP, as in the API).
func slicePort(sl *discoveryv1.EndpointSlice, name string, protocol corev1.Protocol) (uint16, bool) {
	for _, p := range sl.Ports {
		pn, pp := "", corev1.ProtocolTCP
		if p.Name != nil {
			pn = *p.Name
		}
		if p.Protocol != nil {
			pp = *p.Protocol
		}
		if pn != name || pp != protocol || p.Port == nil || *p.Port <= 0 || *p.Port > 65535 {
			continue
		}
		return uint16(*p.Port), true
	}
	return 0, false
}

func protoNumber(p corev1.Protocol) (uint8, bool) {
	switch p {
	case corev1.ProtocolTCP, "":
		return TCP, true
	case corev1.ProtocolUDP:
		return UDP, true
	}
	return 0, false
}

// HostPortOwner is the Service field of the hostPort frontends of the pod
// ns/name: "ns/name/host-port" (no Service name has a slash).
func HostPortOwner(podKey string) string { return podKey + HostPortSuffix }

// HostPortSuffix ends the owner name of hostPort frontends.
const HostPortSuffix = "/host-port"

// PodHostPortFrontends returns the hostPort frontends of pod (a pod of
// this node), sorted by address, as --enable-host-port serves them
// instead of the portmap plugin: for each TCP or UDP container port with a
// hostPort, hostIP:hostPort when hostIP is an IPv4 address other than
// 0.0.0.0, else each of o.NodeAddrs and 0.0.0.0 (the node's loopback),
// with the pod's first IPv4 address and the containerPort as the one
// backend; flagged Local (the client address is kept, as with portmap's
// DNAT). A pod without an IPv4 address, with hostNetwork (its hostPort is
// the host's own port), terminated or being deleted has none.
func PodHostPortFrontends(pod *corev1.Pod, o Options) []*Frontend {
	if pod == nil || pod.Spec.HostNetwork || pod.DeletionTimestamp != nil ||
		pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return nil
	}
	var podIP netip.Addr
	for _, s := range append([]string{pod.Status.PodIP}, podIPs(pod)...) {
		if ip, err := netip.ParseAddr(s); err == nil && ip.Is4() {
			podIP = ip
			break
		}
	}
	if !podIP.IsValid() {
		return nil
	}
	owner := HostPortOwner(pod.Namespace + "/" + pod.Name)
	var out []*Frontend
	seen := map[L4Addr]bool{}
	for _, c := range slices.Concat(pod.Spec.InitContainers, pod.Spec.Containers) {
		for _, p := range c.Ports {
			proto, ok := protoNumber(p.Protocol)
			if !ok || p.HostPort <= 0 || p.HostPort > 65535 || p.ContainerPort <= 0 || p.ContainerPort > 65535 {
				continue
			}
			addrs := append(slices.Clone(o.NodeAddrs), netip.IPv4Unspecified())
			if ip, err := netip.ParseAddr(p.HostIP); err == nil && !ip.IsUnspecified() {
				addrs = []netip.Addr{ip}
			}
			be := L4Addr{Addr: podIP, Port: uint16(p.ContainerPort), Proto: proto}
			for _, ip := range addrs {
				addr := L4Addr{Addr: ip, Port: uint16(p.HostPort), Proto: proto}
				if !ip.Is4() || seen[addr] {
					continue
				}
				seen[addr] = true
				out = append(out, &Frontend{Address: addr, Type: TypeHostPort, Service: owner, PortName: p.Name,
					Local: true, Backends: []L4Addr{be}})
			}
		}
	}
	slices.SortFunc(out, func(a, b *Frontend) int { return a.Address.Compare(b.Address) })
	return out
}

func podIPs(pod *corev1.Pod) []string {
	out := make([]string, 0, len(pod.Status.PodIPs))
	for _, ip := range pod.Status.PodIPs {
		out = append(out, ip.IP)
	}
	return out
}
