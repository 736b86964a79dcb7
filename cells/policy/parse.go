package policy

import (
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	api "github.com/cellium/cellium/api/policy"
	"github.com/cellium/cellium/statedb/labels"
	statepolicy "github.com/cellium/cellium/statedb/policy"
)

// ParseOptions are the agent settings that shape parsed rules.
type ParseOptions struct {
	// ClusterName is added to peer selectors that name no cluster, so
	// that a rule only selects peers of the local cluster. Empty means
	// labels.DefaultClusterName.
	ClusterName string
}

func (o ParseOptions) cluster() string {
	if o.ClusterName == "" {
		return labels.DefaultClusterName
	}
	return o.ClusterName
}

// ParseCNP parses the rules of a CiliumNetworkPolicy (spec, then specs).
// Rules that parse are returned even when others fail; the error joins one
// error per failed rule, each naming the field ("specs[1].ingress[0].
// fromCIDR[0]: ...").
func ParseCNP(cnp *ciliumv2.CiliumNetworkPolicy, opts ParseOptions) ([]*Rule, error) {
	src := Source{Kind: KindCNP, Namespace: cnp.Namespace, Name: cnp.Name, UID: string(cnp.UID)}
	return parseRules(src, cnp.Spec, cnp.Specs, opts)
}

// ParseCCNP parses the rules of a CiliumClusterwideNetworkPolicy, like
// ParseCNP.
func ParseCCNP(ccnp *ciliumv2.CiliumClusterwideNetworkPolicy, opts ParseOptions) ([]*Rule, error) {
	src := Source{Kind: KindCCNP, Name: ccnp.Name, UID: string(ccnp.UID)}
	return parseRules(src, ccnp.Spec, ccnp.Specs, opts)
}

func parseRules(src Source, spec *api.Rule, specs api.Rules, opts ParseOptions) ([]*Rule, error) {
	var (
		out  []*Rule
		errs []error
	)
	type named struct {
		path string
		r    *api.Rule
	}
	var all []named
	if spec != nil {
		all = append(all, named{"spec", spec})
	}
	for i, r := range specs {
		all = append(all, named{fmt.Sprintf("specs[%d]", i), r})
	}
	if len(all) == 0 {
		return nil, fmt.Errorf("%s: neither spec nor specs is set", src)
	}
	for i, n := range all {
		p := &ruleParser{opts: opts, ns: src.Namespace, path: n.path}
		r, err := p.parse(n.r)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %s: %w", src, n.path, err))
			continue
		}
		r.Source, r.Index = src, i
		out = append(out, r)
	}
	return out, errors.Join(errs...)
}

// ruleParser parses one api.Rule.
type ruleParser struct {
	opts     ParseOptions
	ns       string // "" for clusterwide rules
	path     string
	warnings []string
}

func (p *ruleParser) warn(field, format string, args ...any) {
	p.warnings = append(p.warnings, p.path+"."+field+": "+fmt.Sprintf(format, args...))
}

func (p *ruleParser) parse(r *api.Rule) (*Rule, error) {
	if r == nil {
		return nil, errors.New("rule is null")
	}
	out := &Rule{}
	switch {
	case r.EndpointSelector != nil && r.NodeSelector != nil:
		return nil, errors.New("endpointSelector and nodeSelector are both set; use one")
	case r.EndpointSelector != nil:
		sel, err := CompileSelector(r.EndpointSelector)
		if err != nil {
			return nil, fmt.Errorf("endpointSelector: %w", err)
		}
		out.Subject = p.scopeSubject(sel)
	case r.NodeSelector != nil:
		if p.ns != "" {
			return nil, errors.New("nodeSelector: only clusterwide policies may select nodes")
		}
		if _, err := CompileSelector(r.NodeSelector); err != nil {
			return nil, fmt.Errorf("nodeSelector: %w", err)
		}
		p.warn("nodeSelector", "host policies are not enforced (no host firewall); the rule selects nothing")
	default:
		return nil, errors.New("neither endpointSelector nor nodeSelector is set")
	}
	if len(r.Ingress)+len(r.IngressDeny)+len(r.Egress)+len(r.EgressDeny) == 0 {
		return nil, errors.New("the rule has no ingress, ingressDeny, egress or egressDeny section")
	}
	for i, in := range r.Ingress {
		e, err := p.entry(fmt.Sprintf("ingress[%d]", i), false, statepolicy.Ingress, ingressPeers(&in.IngressCommonRule), portRules(in.ToPorts), in.ICMPs)
		if err != nil {
			return nil, err
		}
		if in.Authentication != nil && in.Authentication.Mode != api.AuthenticationModeDisabled {
			p.warn(fmt.Sprintf("ingress[%d].authentication", i), "mutual authentication is not enforced")
		}
		out.Ingress = append(out.Ingress, e)
	}
	for i, in := range r.IngressDeny {
		e, err := p.entry(fmt.Sprintf("ingressDeny[%d]", i), true, statepolicy.Ingress, ingressPeers(&in.IngressCommonRule), denyPortRules(in.ToPorts), in.ICMPs)
		if err != nil {
			return nil, err
		}
		out.Ingress = append(out.Ingress, e)
	}
	for i, eg := range r.Egress {
		path := fmt.Sprintf("egress[%d]", i)
		peers := egressPeers(&eg.EgressCommonRule)
		if len(eg.ToFQDNs) > 0 {
			peers.unsupported = append(peers.unsupported, "toFQDNs")
		}
		e, err := p.entry(path, false, statepolicy.Egress, peers, portRules(eg.ToPorts), eg.ICMPs)
		if err != nil {
			return nil, err
		}
		if eg.Authentication != nil && eg.Authentication.Mode != api.AuthenticationModeDisabled {
			p.warn(path+".authentication", "mutual authentication is not enforced")
		}
		out.Egress = append(out.Egress, e)
	}
	for i, eg := range r.EgressDeny {
		e, err := p.entry(fmt.Sprintf("egressDeny[%d]", i), true, statepolicy.Egress, egressPeers(&eg.EgressCommonRule), denyPortRules(eg.ToPorts), eg.ICMPs)
		if err != nil {
			return nil, err
		}
		out.Egress = append(out.Egress, e)
	}
	out.IngressDefaultDeny = r.EnableDefaultDeny.Ingress == nil || *r.EnableDefaultDeny.Ingress
	out.EgressDefaultDeny = r.EnableDefaultDeny.Egress == nil || *r.EnableDefaultDeny.Egress
	out.Warnings = p.warnings
	return out, nil
}

// scopeSubject limits a CNP's subject to the policy's namespace, replacing
// any namespace requirement the user wrote.
func (p *ruleParser) scopeSubject(sel *Selector) *Selector {
	if p.ns == "" {
		return sel
	}
	var reqs []Requirement
	for _, r := range sel.Requirements() {
		if r.Key != labels.PodNamespaceLabel {
			reqs = append(reqs, r)
		}
	}
	reqs = append(reqs, Requirement{Source: labels.SourceK8s, Key: labels.PodNamespaceLabel, Op: OpIn, Values: []string{p.ns}})
	return NewSelector(reqs...)
}

// scopePeer restricts a peer endpoint selector to the policy's namespace
// (CNP) or to pods (CCNP) unless it names a namespace, and to the local
// cluster unless it names a cluster. Selectors on reserved labels are left
// alone.
func (p *ruleParser) scopePeer(sel *Selector) *Selector {
	if sel.HasSource(labels.SourceReserved) {
		return sel
	}
	var extra []Requirement
	if !sel.HasKey(labels.PodNamespaceLabel) {
		if p.ns != "" {
			extra = append(extra, Requirement{Source: labels.SourceK8s, Key: labels.PodNamespaceLabel, Op: OpIn, Values: []string{p.ns}})
		} else {
			extra = append(extra, Requirement{Source: labels.SourceK8s, Key: labels.PodNamespaceLabel, Op: OpExists})
		}
	}
	if !sel.HasKey(labels.PolicyLabelCluster) {
		extra = append(extra, Requirement{Source: labels.SourceK8s, Key: labels.PolicyLabelCluster, Op: OpIn, Values: []string{p.opts.cluster()}})
	}
	return sel.With(extra...)
}

// peerFields are the peer fields of an ingress or egress section.
type peerFields struct {
	endpoints   []api.EndpointSelector
	endpointsOK bool // the field is present (possibly empty)
	cidrs       api.CIDRSlice
	cidrSets    api.CIDRRuleSlice
	entities    api.EntitySlice
	unsupported []string // names of set fields cellium does not enforce
	anySet      bool
	epField     string
}

func ingressPeers(c *api.IngressCommonRule) peerFields {
	f := peerFields{endpoints: c.FromEndpoints, endpointsOK: c.FromEndpoints != nil, cidrs: c.FromCIDR,
		cidrSets: c.FromCIDRSet, entities: c.FromEntities, epField: "fromEndpoints"}
	if c.FromRequires != nil {
		f.unsupported = append(f.unsupported, "fromRequires")
	}
	if c.FromGroups != nil {
		f.unsupported = append(f.unsupported, "fromGroups")
	}
	if c.FromNodes != nil {
		f.unsupported = append(f.unsupported, "fromNodes")
	}
	return f
}

func egressPeers(c *api.EgressCommonRule) peerFields {
	f := peerFields{endpoints: c.ToEndpoints, endpointsOK: c.ToEndpoints != nil, cidrs: c.ToCIDR,
		cidrSets: c.ToCIDRSet, entities: c.ToEntities, epField: "toEndpoints"}
	if c.ToRequires != nil {
		f.unsupported = append(f.unsupported, "toRequires")
	}
	if c.ToServices != nil {
		f.unsupported = append(f.unsupported, "toServices")
	}
	if c.ToGroups != nil {
		f.unsupported = append(f.unsupported, "toGroups")
	}
	if c.ToNodes != nil {
		f.unsupported = append(f.unsupported, "toNodes")
	}
	return f
}

// portRules and denyPortRules turn both kinds of toPorts into one shape.
type portRule struct {
	ports []api.PortProtocol
	l7    *api.PortRule // nil for deny rules
}

func portRules(rs api.PortRules) []portRule {
	out := make([]portRule, len(rs))
	for i := range rs {
		out[i] = portRule{ports: rs[i].Ports, l7: &rs[i]}
	}
	return out
}

func denyPortRules(rs api.PortDenyRules) []portRule {
	out := make([]portRule, len(rs))
	for i := range rs {
		out[i] = portRule{ports: rs[i].Ports}
	}
	return out
}

// entry parses one ingress/egress (deny) section.
func (p *ruleParser) entry(path string, deny bool, dir statepolicy.Direction, f peerFields, ports []portRule, icmps api.ICMPRules) (*Entry, error) {
	e := &Entry{Deny: deny}
	peerSet := f.endpointsOK || f.cidrs != nil || f.cidrSets != nil || f.entities != nil || len(f.unsupported) > 0
	for _, u := range f.unsupported {
		p.warn(path+"."+u, "not supported; these peers are not selected")
	}
	for i := range f.endpoints {
		sel, err := CompileSelector(&f.endpoints[i])
		if err != nil {
			return nil, fmt.Errorf("%s.%s[%d]: %w", path, f.epField, i, err)
		}
		e.Peers = append(e.Peers, p.scopePeer(sel))
	}
	cidrField, setField, entField := "fromCIDR", "fromCIDRSet", "fromEntities"
	if dir == statepolicy.Egress {
		cidrField, setField, entField = "toCIDR", "toCIDRSet", "toEntities"
	}
	for i, c := range f.cidrs {
		pfx, err := parseCIDR(string(c))
		if err != nil {
			return nil, fmt.Errorf("%s.%s[%d]: %w", path, cidrField, i, err)
		}
		e.Peers = append(e.Peers, NewCIDRSelector(pfx))
	}
	for i, c := range f.cidrSets {
		fp := fmt.Sprintf("%s.%s[%d]", path, setField, i)
		if c.Cidr == "" {
			if c.CIDRGroupRef != "" || c.CIDRGroupSelector != nil {
				p.warn(fmt.Sprintf("%s.%s[%d]", path, setField, i), "CIDR groups are not supported; no addresses are selected")
				continue
			}
			return nil, fmt.Errorf("%s: one of cidr, cidrGroupRef and cidrGroupSelector must be set", fp)
		}
		pfx, err := parseCIDR(string(c.Cidr))
		if err != nil {
			return nil, fmt.Errorf("%s.cidr: %w", fp, err)
		}
		var except []netip.Prefix
		for j, x := range c.ExceptCIDRs {
			xp, err := parseCIDR(string(x))
			if err != nil {
				return nil, fmt.Errorf("%s.except[%d]: %w", fp, j, err)
			}
			if !prefixContains(pfx, xp) {
				return nil, fmt.Errorf("%s.except[%d]: %s is not inside %s", fp, j, xp, pfx)
			}
			except = append(except, xp)
		}
		e.Peers = append(e.Peers, NewCIDRSelector(pfx, except...))
	}
	for i, ent := range f.entities {
		ms, all, err := p.entity(ent)
		if err != nil {
			return nil, fmt.Errorf("%s.%s[%d]: %w", path, entField, i, err)
		}
		e.AnyPeer = e.AnyPeer || all
		e.Peers = append(e.Peers, ms...)
	}
	for i, pr := range ports {
		pp := fmt.Sprintf("%s.toPorts[%d]", path, i)
		if len(pr.ports) == 0 {
			e.Ports = append(e.Ports, PortSpec{})
		}
		for j, pp2 := range pr.ports {
			specs, err := parsePortProtocol(pp2)
			if err != nil {
				return nil, fmt.Errorf("%s.ports[%d]: %w", pp, j, err)
			}
			e.Ports = append(e.Ports, specs...)
		}
		if pr.l7 != nil {
			p.warnL7(pp, pr.l7)
		}
	}
	for i, ir := range icmps {
		for j, fld := range ir.Fields {
			spec, err := parseICMPField(fld)
			if err != nil {
				return nil, fmt.Errorf("%s.icmps[%d].fields[%d]: %w", path, i, j, err)
			}
			e.Ports = append(e.Ports, spec)
		}
	}
	if len(ports) == 0 && len(icmps) == 0 {
		e.Ports = nil
	} else if e.Ports == nil {
		e.Ports = []PortSpec{} // L4 given, but nothing in it: matches nothing
	}
	if !peerSet {
		// No peer field: any peer when ports are given, else nothing (an
		// empty section only switches the direction to default deny).
		e.AnyPeer = e.Ports != nil
	}
	return e, nil
}

func (p *ruleParser) warnL7(path string, pr *api.PortRule) {
	if r := pr.Rules; r != nil {
		for name, n := range map[string]int{"http": len(r.HTTP), "kafka": len(r.Kafka), "dns": len(r.DNS), "l7": len(r.L7)} {
			if n > 0 {
				p.warn(path+".rules."+name, "L7 rules are not enforced; the ports are allowed at L4")
			}
		}
	}
	if pr.TerminatingTLS != nil || pr.OriginatingTLS != nil {
		p.warn(path, "TLS interception is not supported; the ports are allowed at L4")
	}
	if len(pr.ServerNames) > 0 {
		p.warn(path+".serverNames", "SNI matching is not enforced; the ports are allowed at L4")
	}
	if pr.Listener != nil {
		p.warn(path+".listener", "Envoy listeners are not supported; the ports are allowed at L4")
	}
}

// entity returns the matchers of an entity, or all=true for "all".
func (p *ruleParser) entity(e api.Entity) (ms []Matcher, all bool, err error) {
	reserved := func(names ...string) []Matcher {
		out := make([]Matcher, len(names))
		for i, n := range names {
			out[i] = NewSelector(Requirement{Source: labels.SourceReserved, Key: n, Op: OpExists})
		}
		return out
	}
	switch e {
	case api.EntityAll:
		return nil, true, nil
	case api.EntityNone:
		return nil, false, nil
	case api.EntityWorld:
		return reserved(labels.IDNameWorld, labels.IDNameWorldIPv4, labels.IDNameWorldIPv6), false, nil
	case api.EntityCluster:
		ms = reserved(labels.IDNameHost, labels.IDNameRemoteNode, labels.IDNameInit, labels.IDNameIngress,
			labels.IDNameHealth, labels.IDNameUnmanaged, labels.IDNameKubeAPIServer)
		ms = append(ms, NewSelector(Requirement{Source: labels.SourceK8s, Key: labels.PolicyLabelCluster, Op: OpIn, Values: []string{p.opts.cluster()}}))
		return ms, false, nil
	case api.EntityHost, api.EntityInit, api.EntityIngress, api.EntityUnmanaged, api.EntityRemoteNode,
		api.EntityHealth, api.EntityKubeAPIServer, api.EntityWorldIPv4, api.EntityWorldIPv6:
		return reserved(string(e)), false, nil
	}
	return nil, false, fmt.Errorf("unknown entity %q (want one of all, world, cluster, host, remote-node, health, init, ingress, unmanaged, kube-apiserver, none)", e)
}

// parseCIDR reads a prefix or a single address (as a full-length prefix).
func parseCIDR(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("invalid CIDR %q: %w", s, err)
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("invalid CIDR %q: want an address or a prefix like 10.0.0.0/8", s)
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// protoNumbers maps rule protocol names to IP protocol numbers. The
// port-less protocols (VRRP and below) take no port.
var protoNumbers = map[api.L4Proto]uint8{
	api.ProtoTCP: statepolicy.ProtoTCP, api.ProtoUDP: statepolicy.ProtoUDP, api.ProtoSCTP: statepolicy.ProtoSCTP,
	api.ProtoVRRP: 112, api.ProtoIGMP: 2, api.ProtoGRE: 47, api.ProtoIPIP: 4, api.ProtoIPV6: 41, api.ProtoESP: 50, api.ProtoAH: 51,
}

var portNameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,13}[a-z0-9])?$`)

// parsePortProtocol reads one ports entry.
func parsePortProtocol(pp api.PortProtocol) ([]PortSpec, error) {
	var spec PortSpec
	proto := strings.ToUpper(string(pp.Protocol))
	switch api.L4Proto(proto) {
	case "", api.ProtoAny:
	default:
		n, ok := protoNumbers[api.L4Proto(proto)]
		if !ok {
			return nil, fmt.Errorf("unknown protocol %q (want TCP, UDP, SCTP, ANY or an IP protocol name)", pp.Protocol)
		}
		spec.Proto = n
	}
	switch {
	case pp.Port == "":
	case pp.Port[0] >= '0' && pp.Port[0] <= '9':
		n, err := strconv.ParseUint(pp.Port, 10, 16)
		if err != nil {
			return nil, fmt.Errorf("port %q: want a number from 0 to 65535 or a port name", pp.Port)
		}
		spec.Port = uint16(n)
	default:
		name := strings.ToLower(pp.Port)
		if !portNameRE.MatchString(name) {
			return nil, fmt.Errorf("port %q: not a valid port name (lower-case letters, digits and '-', at most 15)", pp.Port)
		}
		spec.Name = name
	}
	if pp.EndPort != 0 {
		switch {
		case pp.EndPort < 0 || pp.EndPort > 65535:
			return nil, fmt.Errorf("endPort %d: want 0 to 65535", pp.EndPort)
		case spec.Name != "":
			return nil, fmt.Errorf("endPort %d: a named port cannot start a range", pp.EndPort)
		case spec.Port == 0:
			return nil, fmt.Errorf("endPort %d: needs a start port", pp.EndPort)
		case uint16(pp.EndPort) < spec.Port:
			return nil, fmt.Errorf("endPort %d is below port %d", pp.EndPort, spec.Port)
		}
		spec.EndPort = uint16(pp.EndPort)
	}
	if spec.Proto != 0 && spec.Proto != statepolicy.ProtoTCP && spec.Proto != statepolicy.ProtoUDP &&
		spec.Proto != statepolicy.ProtoSCTP && (spec.Port != 0 || spec.Name != "") {
		return nil, fmt.Errorf("protocol %s has no ports; leave port empty", proto)
	}
	return []PortSpec{spec}, nil
}

// icmpTypes are the ICMP type names a rule may use, per family.
var icmpTypes = map[string]map[string]uint8{
	api.ICMPFamilyIPv4: {"EchoReply": 0, "DestinationUnreachable": 3, "Redirect": 5, "Echo": 8, "EchoRequest": 8,
		"RouterAdvertisement": 9, "RouterSelection": 10, "TimeExceeded": 11, "ParameterProblem": 12,
		"Timestamp": 13, "TimestampReply": 14, "Photuris": 40, "ExtendedEchoRequest": 42, "ExtendedEchoReply": 43},
	api.ICMPFamilyIPv6: {"DestinationUnreachable": 1, "PacketTooBig": 2, "TimeExceeded": 3, "ParameterProblem": 4,
		"EchoRequest": 128, "EchoReply": 129, "MulticastListenerQuery": 130, "MulticastListenerReport": 131,
		"MulticastListenerDone": 132, "RouterSolicitation": 133, "RouterAdvertisement": 134,
		"NeighborSolicitation": 135, "NeighborAdvertisement": 136, "RedirectMessage": 137},
}

// parseICMPField reads one ICMP type.
func parseICMPField(f api.ICMPField) (PortSpec, error) {
	fam := f.Family
	if fam == "" {
		fam = api.ICMPFamilyIPv4
	}
	proto := statepolicy.ProtoICMP
	switch fam {
	case api.ICMPFamilyIPv4:
	case api.ICMPFamilyIPv6:
		proto = 58
	default:
		return PortSpec{}, fmt.Errorf("family %q: want IPv4 or IPv6", f.Family)
	}
	if f.Type == nil {
		return PortSpec{}, errors.New("type is missing")
	}
	var t uint8
	if f.Type.Type == 0 { // an integer
		if f.Type.IntVal < 0 || f.Type.IntVal > 255 {
			return PortSpec{}, fmt.Errorf("type %d: want 0 to 255", f.Type.IntVal)
		}
		t = uint8(f.Type.IntVal)
	} else {
		n, ok := icmpTypes[fam][f.Type.StrVal]
		if !ok {
			return PortSpec{}, fmt.Errorf("type %q: not an %s ICMP type name", f.Type.StrVal, fam)
		}
		t = n
	}
	return PortSpec{Proto: proto, Port: uint16(t), ICMP: true}, nil
}
