package parser

import (
	"net/netip"
	"strings"
	"sync"

	flowpb "github.com/cilium/cilium/api/v1/flow"

	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/labels"
	"github.com/cellium/cellium/statedb/monitor"
	"github.com/cellium/cellium/statedb/policy"
)

// Policy match types of policy verdicts (Flow.policy_match_type), Cilium's
// POLICY_MATCH_* numbers: which part of the deciding entry matched.
const (
	PolicyMatchNone      = 0
	PolicyMatchL3Only    = 1
	PolicyMatchL3L4      = 2
	PolicyMatchL4Only    = 3
	PolicyMatchAll       = 4
	PolicyMatchL3Proto   = 5
	PolicyMatchProtoOnly = 6
)

// provenance fills the rules that decided a policy verdict or a policy
// drop, from the computed policy of the endpoint that saw the packet:
//
//   - allowed: the rules of the allow entry that matched
//     (*_allowed_by);
//   - denied or audited: the rules of the deny entry that matched, or, when
//     no entry matched (a default deny), the rules that make the direction
//     deny by default (*_denied_by). Cilium names nothing in that case.
//
// A verdict the current policy would not give (the policy changed since
// the packet) gets no provenance rather than a wrong one.
func (p *Parser) provenance(f *flowpb.Flow, ev *monitor.Event) {
	if p.src.Policies == nil || ev.EndpointID == 0 {
		return
	}
	var (
		dir    policy.Direction
		remote identity.NumericIdentity
	)
	var remoteIP netip.Addr
	switch ev.Direction {
	case monitor.DirectionIngress:
		dir, remote, remoteIP = policy.Ingress, identity.NumericIdentity(f.GetSource().GetIdentity()), ev.SrcIP.Unmap()
	case monitor.DirectionEgress:
		dir, remote, remoteIP = policy.Egress, identity.NumericIdentity(f.GetDestination().GetIdentity()), ev.DstIP.Unmap()
	default:
		return
	}
	pol, ok := p.src.Policies.EndpointPolicy(ev.EndpointID)
	if !ok || pol == nil {
		return
	}
	port := ev.DstPort
	if ev.Protocol == 1 || ev.Protocol == 58 {
		// The datapath looks ICMP types up in the port field.
		port = uint16(ev.ICMPType)
	}
	dp := pol.Direction(dir)
	allowed, entry, matched := dp.Decide(remote, ev.Protocol, port)
	// Unless a deny entry of the remote's identity decided, the datapath
	// also decides on the identity of the policy CIDR that holds the
	// remote address (a pod address an ipBlock names): a deny there is
	// final, an allow there allows what the identity did not.
	if cidr := p.cidrIdentity(remoteIP); cidr != 0 && cidr != remote && !(matched && entry.Deny) {
		ca, ce, cm := dp.Decide(cidr, ev.Protocol, port)
		switch {
		case cm && ce.Deny:
			allowed, entry, matched = false, ce, true
		case allowed:
		case cm && ca:
			allowed, entry, matched = true, ce, true
		}
	}
	if ev.Type == monitor.TypePolicyVerdict && matched {
		f.PolicyMatchType = MatchType(entry.Key)
	}
	var names []string
	switch f.Verdict {
	case flowpb.Verdict_FORWARDED:
		if !allowed {
			return
		}
		names = entry.DerivedFrom
	case flowpb.Verdict_DROPPED, flowpb.Verdict_AUDIT:
		if allowed {
			return
		}
		names = entry.DerivedFrom
		if !matched {
			names = dp.EnforcedBy
		}
	}
	rules := p.policies.get(names, pol.Revision)
	switch {
	case f.Verdict == flowpb.Verdict_FORWARDED && dir == policy.Ingress:
		f.IngressAllowedBy = rules
	case f.Verdict == flowpb.Verdict_FORWARDED:
		f.EgressAllowedBy = rules
	case dir == policy.Ingress:
		f.IngressDeniedBy = rules
	default:
		f.EgressDeniedBy = rules
	}
}

// cidrIdentity returns the identity of the policy CIDR that also holds
// ip (ipcache.Entry.CIDRIdentity), 0 when none.
func (p *Parser) cidrIdentity(ip netip.Addr) identity.NumericIdentity {
	if p.src.IPCache == nil || !ip.IsValid() {
		return 0
	}
	if row, ok := p.src.IPCache.LookupIP(ip); ok {
		return row.CIDRIdentity
	}
	return 0
}

// MatchType returns the policy match type of a deciding entry: L3 when it
// names an identity, L4 when it names a port, protocol only when it names
// a protocol without a port.
func MatchType(k policy.Key) uint32 {
	l3 := k.Identity != 0
	switch {
	case k.Proto == policy.ProtoAny && l3:
		return PolicyMatchL3Only
	case k.Proto == policy.ProtoAny:
		return PolicyMatchAll
	case k.PortPrefixLen == 0 && l3:
		return PolicyMatchL3Proto
	case k.PortPrefixLen == 0:
		return PolicyMatchProtoOnly
	case l3:
		return PolicyMatchL3L4
	}
	return PolicyMatchL4Only
}

// PolicyList converts rule names as the policy engine gives them
// ("CiliumNetworkPolicy/default/allow-web", "NetworkPolicy/default/deny[1]",
// "CiliumClusterwideNetworkPolicy/allow-dns") into Hubble's Policy
// messages, one per object (several rules of one object are one policy),
// in order; nil for none.
func PolicyList(names []string, revision uint64) []*flowpb.Policy {
	if len(names) == 0 {
		return nil
	}
	out := make([]*flowpb.Policy, 0, len(names))
	for _, n := range names {
		pol := PolicyOf(n, revision)
		if k := len(out); k > 0 && out[k-1].Kind == pol.Kind && out[k-1].Namespace == pol.Namespace && out[k-1].Name == pol.Name {
			continue
		}
		out = append(out, pol)
	}
	return out
}

// PolicyOf converts one rule name into Hubble's Policy: kind, namespace,
// name, the revision of the endpoint's policy, and the labels Cilium gives
// a policy's rules (derived-from, name, namespace).
func PolicyOf(name string, revision uint64) *flowpb.Policy {
	if i := strings.LastIndexByte(name, '['); i > 0 && strings.HasSuffix(name, "]") {
		name = name[:i]
	}
	parts := strings.Split(name, "/")
	pol := &flowpb.Policy{Revision: revision}
	switch len(parts) {
	case 3:
		pol.Kind, pol.Namespace, pol.Name = parts[0], parts[1], parts[2]
	case 2:
		pol.Kind, pol.Name = parts[0], parts[1]
	default:
		pol.Name = name
	}
	k8s := labels.SourceK8s + ":"
	if pol.Kind != "" {
		pol.Labels = append(pol.Labels, k8s+labels.PolicyLabelDerivedFrom+"="+pol.Kind)
	}
	pol.Labels = append(pol.Labels, k8s+labels.PolicyLabelName+"="+pol.Name)
	if pol.Namespace != "" {
		pol.Labels = append(pol.Labels, k8s+labels.PolicyLabelNamespace+"="+pol.Namespace)
	}
	return pol
}

// maxPolicyCache bounds the cache of converted rule lists.
const maxPolicyCache = 4096

// policyCache keeps the Policy messages of rule lists, keyed by the list
// (the computed policy's slices are immutable: their address names them)
// and the revision. The messages are shared by the flows.
type policyCache struct {
	mu sync.Mutex
	m  map[policyKey][]*flowpb.Policy
}

type policyKey struct {
	first    *string
	n        int
	revision uint64
}

func (c *policyCache) get(names []string, revision uint64) []*flowpb.Policy {
	if len(names) == 0 {
		return nil
	}
	k := policyKey{&names[0], len(names), revision}
	c.mu.Lock()
	defer c.mu.Unlock()
	if l, ok := c.m[k]; ok {
		return l
	}
	l := PolicyList(names, revision)
	if c.m == nil || len(c.m) >= maxPolicyCache {
		c.m = make(map[policyKey][]*flowpb.Policy)
	}
	c.m[k] = l
	return l
}
