package policy

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	api "github.com/cellium/cellium/api/policy"
	"github.com/cellium/cellium/statedb/labels"
	statepolicy "github.com/cellium/cellium/statedb/policy"
)

// ParseNetworkPolicy turns a Kubernetes NetworkPolicy into one rule with
// the Kubernetes semantics:
//
//   - the subject is spec.podSelector within the policy's namespace;
//   - the policy takes part in the directions listed in policyTypes; when
//     policyTypes is missing, in ingress always and in egress when it has
//     egress rules. A direction it takes part in is deny-by-default even
//     with no rules in it;
//   - a rule with no from/to allows every peer, a rule with no ports every
//     port; peers and ports of one rule are AND-ed, rules OR-ed;
//   - a podSelector peer selects pods of the policy's namespace, a
//     namespaceSelector peer pods of the selected namespaces (an empty one:
//     every namespace), both in one peer pods matching both;
//   - ipBlock selects addresses outside the cluster in cidr but not in
//     except;
//   - a port is a number (with endPort, a range) or a container port name,
//     resolved per endpoint; the protocol defaults to TCP.
//
// Possible errors: a malformed selector, CIDR, port or protocol; the error
// names the field.
func ParseNetworkPolicy(np *networkingv1.NetworkPolicy, opts ParseOptions) (*Rule, error) {
	src := Source{Kind: KindNetworkPolicy, Namespace: np.Namespace, Name: np.Name, UID: string(np.UID)}
	p := &npParser{ns: np.Namespace, cluster: opts.cluster()}
	r, err := p.parse(&np.Spec)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", src, err)
	}
	r.Source = src
	return r, nil
}

type npParser struct {
	ns, cluster string
}

func (p *npParser) parse(spec *networkingv1.NetworkPolicySpec) (*Rule, error) {
	subj, err := p.selector(&spec.PodSelector, labels.SourceK8s, "")
	if err != nil {
		return nil, fmt.Errorf("spec.podSelector: %w", err)
	}
	r := &Rule{
		Subject:            subj.With(Requirement{Source: labels.SourceK8s, Key: labels.PodNamespaceLabel, Op: OpIn, Values: []string{p.ns}}),
		IngressDefaultDeny: true,
		EgressDefaultDeny:  true,
	}
	ingress, egress := true, len(spec.Egress) > 0
	if len(spec.PolicyTypes) > 0 {
		ingress = slices.Contains(spec.PolicyTypes, networkingv1.PolicyTypeIngress)
		egress = slices.Contains(spec.PolicyTypes, networkingv1.PolicyTypeEgress)
		for i, t := range spec.PolicyTypes {
			if t != networkingv1.PolicyTypeIngress && t != networkingv1.PolicyTypeEgress {
				return nil, fmt.Errorf("spec.policyTypes[%d]: %q is neither Ingress nor Egress", i, t)
			}
		}
	}
	if ingress {
		for i, in := range spec.Ingress {
			e, err := p.entry(in.From, in.Ports)
			if err != nil {
				return nil, fmt.Errorf("spec.ingress[%d]: %w", i, err)
			}
			r.Ingress = append(r.Ingress, e)
		}
		if len(r.Ingress) == 0 {
			r.Ingress = []*Entry{{}} // takes part, allows nothing
		}
	}
	if egress {
		for i, eg := range spec.Egress {
			e, err := p.entry(eg.To, eg.Ports)
			if err != nil {
				return nil, fmt.Errorf("spec.egress[%d]: %w", i, err)
			}
			r.Egress = append(r.Egress, e)
		}
		if len(r.Egress) == 0 {
			r.Egress = []*Entry{{}}
		}
	}
	return r, nil
}

// selector compiles a Kubernetes label selector, giving each key the source
// and prefixing it with keyPrefix.
func (p *npParser) selector(ls *metav1.LabelSelector, source, keyPrefix string) (*Selector, error) {
	es := api.NewEndpointSelector(ls)
	var reqs []Requirement
	for k, v := range es.MatchLabels {
		reqs = append(reqs, Requirement{Source: source, Key: keyPrefix + k, Op: OpIn, Values: []string{v}})
	}
	for i, e := range es.MatchExpressions {
		if e.Key == "" {
			return nil, fmt.Errorf("matchExpressions[%d]: empty key", i)
		}
		req, err := compileRequirement(source, keyPrefix+e.Key, e.Operator, e.Values)
		if err != nil {
			return nil, fmt.Errorf("matchExpressions[%d]: %w", i, err)
		}
		reqs = append(reqs, req)
	}
	return NewSelector(reqs...), nil
}

func (p *npParser) entry(peers []networkingv1.NetworkPolicyPeer, ports []networkingv1.NetworkPolicyPort) (*Entry, error) {
	e := &Entry{AnyPeer: len(peers) == 0}
	for i, peer := range peers {
		m, err := p.peer(&peer)
		if err != nil {
			return nil, fmt.Errorf("peers[%d]: %w", i, err)
		}
		e.Peers = append(e.Peers, m)
	}
	for i, port := range ports {
		spec, err := npPort(port)
		if err != nil {
			return nil, fmt.Errorf("ports[%d]: %w", i, err)
		}
		e.Ports = append(e.Ports, spec)
	}
	return e, nil
}

func (p *npParser) peer(peer *networkingv1.NetworkPolicyPeer) (Matcher, error) {
	if peer.IPBlock != nil {
		if peer.PodSelector != nil || peer.NamespaceSelector != nil {
			return nil, errors.New("ipBlock cannot be combined with podSelector or namespaceSelector")
		}
		pfx, err := netip.ParsePrefix(peer.IPBlock.CIDR)
		if err != nil {
			return nil, fmt.Errorf("ipBlock.cidr: invalid CIDR %q: %w", peer.IPBlock.CIDR, err)
		}
		pfx = pfx.Masked()
		var except []netip.Prefix
		for j, x := range peer.IPBlock.Except {
			xp, err := netip.ParsePrefix(x)
			if err != nil {
				return nil, fmt.Errorf("ipBlock.except[%d]: invalid CIDR %q: %w", j, x, err)
			}
			if !prefixContains(pfx, xp.Masked()) {
				return nil, fmt.Errorf("ipBlock.except[%d]: %s is not inside %s", j, x, pfx)
			}
			except = append(except, xp)
		}
		return NewCIDRSelector(pfx, except...), nil
	}
	if peer.PodSelector == nil && peer.NamespaceSelector == nil {
		return nil, errors.New("a peer needs podSelector, namespaceSelector or ipBlock")
	}
	sel := WildcardSelector()
	if peer.PodSelector != nil {
		s, err := p.selector(peer.PodSelector, labels.SourceK8s, "")
		if err != nil {
			return nil, fmt.Errorf("podSelector: %w", err)
		}
		sel = s
	}
	if peer.NamespaceSelector != nil {
		ns, err := p.selector(peer.NamespaceSelector, labels.SourceK8s, labels.PodNamespaceMetaLabels+".")
		if err != nil {
			return nil, fmt.Errorf("namespaceSelector: %w", err)
		}
		sel = sel.With(ns.reqs...)
		// Only pods (of any namespace) are selected, even by {}.
		sel = sel.With(Requirement{Source: labels.SourceK8s, Key: labels.PodNamespaceLabel, Op: OpExists})
	} else {
		sel = sel.With(Requirement{Source: labels.SourceK8s, Key: labels.PodNamespaceLabel, Op: OpIn, Values: []string{p.ns}})
	}
	return sel.With(Requirement{Source: labels.SourceK8s, Key: labels.PolicyLabelCluster, Op: OpIn, Values: []string{p.cluster}}), nil
}

func npPort(port networkingv1.NetworkPolicyPort) (PortSpec, error) {
	proto := corev1.ProtocolTCP
	if port.Protocol != nil {
		proto = *port.Protocol
	}
	var spec PortSpec
	switch proto {
	case corev1.ProtocolTCP:
		spec.Proto = statepolicy.ProtoTCP
	case corev1.ProtocolUDP:
		spec.Proto = statepolicy.ProtoUDP
	case corev1.ProtocolSCTP:
		spec.Proto = statepolicy.ProtoSCTP
	default:
		return PortSpec{}, fmt.Errorf("protocol %q: want TCP, UDP or SCTP", proto)
	}
	if port.Port != nil {
		if port.Port.Type == intstr.Int {
			if port.Port.IntVal < 1 || port.Port.IntVal > 65535 {
				return PortSpec{}, fmt.Errorf("port %d: want 1 to 65535", port.Port.IntVal)
			}
			spec.Port = uint16(port.Port.IntVal)
		} else {
			if !portNameRE.MatchString(port.Port.StrVal) {
				return PortSpec{}, fmt.Errorf("port %q: not a valid port name", port.Port.StrVal)
			}
			spec.Name = port.Port.StrVal
		}
	}
	if port.EndPort != nil {
		switch {
		case spec.Port == 0:
			return PortSpec{}, errors.New("endPort needs a numeric port")
		case *port.EndPort < int32(spec.Port) || *port.EndPort > 65535:
			return PortSpec{}, fmt.Errorf("endPort %d: want port (%d) to 65535", *port.EndPort, spec.Port)
		}
		spec.EndPort = uint16(*port.EndPort)
	}
	return spec, nil
}
