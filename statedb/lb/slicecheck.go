package lb

import (
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// EndpointSliceProblems lists what DeriveFrontends skips in the
// EndpointSlices of svc, sorted, one sentence each: an endpoint address
// that is not an IP address or not of the slice's address family, a
// slice port out of range (1..65535) or listed twice, an address listed
// twice in one slice, an unknown address type, and a port of the Service
// no IPv4 slice with endpoints has a port for (by name and protocol).
// IPv6 and FQDN slices are not problems: the datapath serves IPv4 and
// leaves them out on purpose. Nil means nothing was skipped.
func EndpointSliceProblems(svc *corev1.Service, sls []*discoveryv1.EndpointSlice) []string {
	if svc == nil || svc.Spec.Type == corev1.ServiceTypeExternalName {
		return nil
	}
	var out []string
	type portKey struct {
		name  string
		proto corev1.Protocol
	}
	have := map[portKey]bool{}
	withEndpoints := false
	for _, sl := range sls {
		switch sl.AddressType {
		case discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6:
		case discoveryv1.AddressTypeFQDN:
			continue
		default:
			out = append(out, fmt.Sprintf("EndpointSlice %s: unknown addressType %q", sl.Name, sl.AddressType))
			continue
		}
		v4 := sl.AddressType == discoveryv1.AddressTypeIPv4
		seenPort := map[portKey]bool{}
		for _, p := range sl.Ports {
			k := portKey{proto: corev1.ProtocolTCP}
			if p.Name != nil {
				k.name = *p.Name
			}
			if p.Protocol != nil {
				k.proto = *p.Protocol
			}
			if p.Port != nil && (*p.Port <= 0 || *p.Port > 65535) {
				out = append(out, fmt.Sprintf("EndpointSlice %s: port %q: %d is out of range (1-65535)", sl.Name, k.name, *p.Port))
				continue
			}
			if seenPort[k] {
				out = append(out, fmt.Sprintf("EndpointSlice %s: port %q/%s is listed twice", sl.Name, k.name, k.proto))
				continue
			}
			seenPort[k] = true
			if v4 && p.Port != nil {
				have[k] = true
			}
		}
		seenAddr := map[netip.Addr]bool{}
		for _, ep := range sl.Endpoints {
			for _, a := range ep.Addresses {
				ip, err := netip.ParseAddr(a)
				switch {
				case err != nil:
					out = append(out, fmt.Sprintf("EndpointSlice %s: endpoint address %q is not an IP address", sl.Name, a))
					continue
				case v4 && !ip.Is4(), !v4 && (!ip.Is6() || ip.Is4In6()):
					out = append(out, fmt.Sprintf("EndpointSlice %s: endpoint address %q is not of the slice's addressType %s", sl.Name, a, sl.AddressType))
					continue
				case seenAddr[ip]:
					out = append(out, fmt.Sprintf("EndpointSlice %s: endpoint address %s is listed twice", sl.Name, ip))
					continue
				}
				seenAddr[ip] = true
				if v4 {
					withEndpoints = true
				}
			}
		}
	}
	if withEndpoints {
		for _, p := range svc.Spec.Ports {
			k := portKey{name: p.Name, proto: p.Protocol}
			if k.proto == "" {
				k.proto = corev1.ProtocolTCP
			}
			if k.proto != corev1.ProtocolTCP && k.proto != corev1.ProtocolUDP {
				continue // not served (SCTP)
			}
			if !have[k] {
				out = append(out, fmt.Sprintf("no EndpointSlice has a port %q/%s for the Service's port %d: it has no backends", k.name, k.proto, p.Port))
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
