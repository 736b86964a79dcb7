package lb

import (
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// ServiceFrontends returns the frontends of svc with their backends from
// slices (the Service's EndpointSlices), sorted by address, without
// backend IDs and status:
//
//   - one frontend per IPv4 ClusterIP (spec.clusterIPs) and TCP or UDP
//     port; headless Services, ExternalName Services, IPv6, SCTP,
//     NodePorts, LoadBalancer IPs and externalIPs have none (socket LB
//     translates ClusterIPs only);
//   - a frontend's backends are the addresses of the IPv4 slices'
//     endpoints that are ready (conditions.ready unset counts as ready),
//     with the port of the slice port of the same name and protocol;
//   - sessionAffinity ClientIP gives every frontend session affinity
//     with sessionAffinityConfig.clientIP.timeoutSeconds (10800 when
//     unset, as the API server defaults it).
func ServiceFrontends(svc *corev1.Service, slices_ []*discoveryv1.EndpointSlice) []*Frontend {
	if svc == nil || svc.Spec.Type == corev1.ServiceTypeExternalName {
		return nil
	}
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 && svc.Spec.ClusterIP != "" {
		ips = []string{svc.Spec.ClusterIP}
	}
	name := svc.Namespace + "/" + svc.Name
	affinity, timeout := sessionAffinity(svc)
	var out []*Frontend
	seen := map[L4Addr]bool{}
	for _, s := range ips {
		ip, err := netip.ParseAddr(s)
		if err != nil || !ip.Is4() {
			continue // "None" (headless), IPv6
		}
		for _, p := range svc.Spec.Ports {
			proto, ok := protoNumber(p.Protocol)
			if !ok || p.Port <= 0 || p.Port > 65535 {
				continue
			}
			addr := L4Addr{Addr: ip, Port: uint16(p.Port), Proto: proto}
			if seen[addr] {
				continue
			}
			seen[addr] = true
			out = append(out, &Frontend{Address: addr, Service: name, PortName: p.Name,
				Backends: portBackends(slices_, p.Name, proto), SessionAffinity: affinity, AffinityTimeout: timeout})
		}
	}
	slices.SortFunc(out, func(a, b *Frontend) int { return a.Address.Compare(b.Address) })
	return out
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
