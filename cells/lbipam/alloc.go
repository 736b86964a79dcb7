package lbipam

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	k8stables "github.com/cellium/cellium/statedb/k8s"
)

// Reasons of the cilium.io/IPAMRequestSatisfied condition (Cilium's).
const (
	reasonSatisfied        = "satisfied"
	reasonNoPool           = "no_pool"
	reasonOutOfIPs         = "out_of_ips"
	reasonAlreadyAlloc     = "already_allocated"
	reasonSelectorMismatch = "pool_selector_mismatch"
	// reasonAlreadyAllocIncompatible: a requested address is held by
	// Services this one may not share it with.
	reasonAlreadyAllocIncompatible = "already_allocated_incompatible_service"
)

// Reasons of the pool conditions.
const (
	reasonCountsNoReason = "noreason"
	reasonCIDROverlap    = "cidr_overlap"
	reasonResolved       = "resolved"
	reasonPodCIDROverlap = "pod_cidr_overlap"
)

// PodCIDR is one node's pod CIDR, from its CiliumNode.
type PodCIDR struct {
	Node   string
	Prefix netip.Prefix
}

// ipRange is the addresses from to to, inclusive; both IPv4.
type ipRange struct{ from, to netip.Addr }

func (r ipRange) contains(a netip.Addr) bool { return r.from.Compare(a) <= 0 && a.Compare(r.to) <= 0 }

func (r ipRange) overlaps(o ipRange) bool {
	return r.from.Compare(o.to) <= 0 && o.from.Compare(r.to) <= 0
}

func (r ipRange) size() uint64 { return uint64(u32(r.to)-u32(r.from)) + 1 }

func (r ipRange) String() string {
	if p, ok := r.prefix(); ok {
		return p.String()
	}
	return r.from.String() + "-" + r.to.String()
}

// prefix returns the range as a CIDR when it is exactly one.
func (r ipRange) prefix() (netip.Prefix, bool) {
	size := r.size()
	if size&(size-1) != 0 {
		return netip.Prefix{}, false
	}
	bits := 32
	for s := size; s > 1; s >>= 1 {
		bits--
	}
	p := netip.PrefixFrom(r.from, bits)
	return p, p.Masked().Addr() == r.from
}

func u32(a netip.Addr) uint32 {
	b := a.As4()
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

func prefixRange(p netip.Prefix) ipRange {
	p = p.Masked()
	from := p.Addr()
	last := u32(from) | (1<<(32-p.Bits()) - 1)
	if p.Bits() == 0 {
		last = ^uint32(0)
	}
	return ipRange{from, netip.AddrFrom4([4]byte{byte(last >> 24), byte(last >> 16), byte(last >> 8), byte(last)})}
}

// pool is the parsed form of a CiliumLoadBalancerIPPool.
type pool struct {
	obj      *ciliumv2.CiliumLoadBalancerIPPool
	selector labels.Selector // nil: the selector is invalid, nothing matches
	ranges   []ipRange       // IPv4 blocks
	reserved map[netip.Addr]bool
	// withheld are the parts of ranges that overlap pod CIDRs.
	withheld []ipRange
	// conflict is the PoolConflict message, "" without conflict.
	conflict string
	// podOverlap is the PodCIDRConflict message, "" without overlap.
	podOverlap string
}

func (p *pool) name() string { return p.obj.Name }

// active is whether new addresses may come from p.
func (p *pool) active() bool { return !p.obj.Spec.Disabled && p.conflict == "" }

func (p *pool) selects(lbls labels.Set) bool { return p.selector != nil && p.selector.Matches(lbls) }

// usable is whether a is one of p's addresses that may be held.
func (p *pool) usable(a netip.Addr) bool {
	if !a.Is4() || p.reserved[a] {
		return false
	}
	in := false
	for _, r := range p.ranges {
		if r.contains(a) {
			in = true
			break
		}
	}
	if !in {
		return false
	}
	for _, w := range p.withheld {
		if w.contains(a) {
			return false
		}
	}
	return true
}

// parsePool parses a pool; problems parsing are returned as messages and
// the bad parts skipped.
func parsePool(obj *ciliumv2.CiliumLoadBalancerIPPool) (*pool, []string) {
	p := &pool{obj: obj, reserved: map[netip.Addr]bool{}}
	var problems []string
	if obj.Spec.ServiceSelector == nil {
		p.selector = labels.Everything()
	} else if sel, err := metav1.LabelSelectorAsSelector(obj.Spec.ServiceSelector); err != nil {
		problems = append(problems, fmt.Sprintf("invalid serviceSelector: %v", err))
	} else {
		p.selector = sel
	}
	for _, b := range obj.Spec.Blocks {
		var r ipRange
		fromCIDR := false
		switch {
		case b.Cidr != "":
			pfx, err := netip.ParsePrefix(string(b.Cidr))
			if err != nil {
				problems = append(problems, fmt.Sprintf("invalid cidr %q: %v", b.Cidr, err))
				continue
			}
			if !pfx.Addr().Is4() {
				continue // IPv6: not handed out by cellium
			}
			r, fromCIDR = prefixRange(pfx), true
		default:
			from, err := netip.ParseAddr(b.Start)
			if err != nil {
				problems = append(problems, fmt.Sprintf("invalid start %q: %v", b.Start, err))
				continue
			}
			to := from
			if b.Stop != "" {
				if to, err = netip.ParseAddr(b.Stop); err != nil {
					problems = append(problems, fmt.Sprintf("invalid stop %q: %v", b.Stop, err))
					continue
				}
			}
			if !from.Is4() || !to.Is4() {
				continue
			}
			if to.Less(from) {
				problems = append(problems, fmt.Sprintf("start %s is after stop %s", from, to))
				continue
			}
			r = ipRange{from, to}
		}
		p.ranges = append(p.ranges, r)
		if fromCIDR && obj.Spec.AllowFirstLastIPs == ciliumv2.AllowFirstLastIPNo && r.size() > 2 {
			p.reserved[r.from], p.reserved[r.to] = true, true
		}
	}
	return p, problems
}

// ServiceOutcome is what LB IPAM wants a Service's status to be.
type ServiceOutcome struct {
	// Service is the Service as last seen.
	Service *corev1.Service
	// Responsible is false for a Service LB IPAM gave up (deleted pool,
	// type or class changed): its addresses and condition are removed.
	Responsible bool
	// IPs are its addresses, in the order they were handed out.
	IPs []netip.Addr
	// Satisfied, Reason and Message are the condition.
	Satisfied       bool
	Reason, Message string
}

// PoolOutcome is what LB IPAM wants a pool's status to be.
type PoolOutcome struct {
	Pool                   *ciliumv2.CiliumLoadBalancerIPPool
	Total, Used, Available uint64
	// Conflict is the PoolConflict message ("" for none).
	Conflict string
	// PodCIDROverlap is the PodCIDRConflict message ("" for none).
	PodCIDROverlap string
}

// Outcome is the result of one State.Reconcile.
type Outcome struct {
	Services []ServiceOutcome
	Pools    []PoolOutcome
	// Released are the addresses released in this pass, by Service key.
	Released map[string][]netip.Addr
	// Problems are messages about invalid pools, by pool name.
	Problems map[string][]string
}

// held is what one Service holds.
type held struct {
	uid types.UID
	ips []netip.Addr
}

// State is LB IPAM's memory: which Service holds which address. An
// address has one holder, or several Services that share it: all with
// the same lbipam.cilium.io/sharing-key and compatible (sharable). It is
// not safe for concurrent use.
type State struct {
	// DefaultLBIPAM is whether Services without spec.loadBalancerClass
	// are LB IPAM's (--default-lb-service-ipam=lbipam).
	DefaultLBIPAM bool

	holders map[string]*held           // Service key -> its addresses
	owner   map[netip.Addr][]string    // address -> keys of the Services holding it
	svcs    map[string]*corev1.Service // key -> Service, as of the last pass
}

// NewState returns an empty state.
func NewState(defaultLBIPAM bool) *State {
	return &State{DefaultLBIPAM: defaultLBIPAM, holders: map[string]*held{},
		owner: map[netip.Addr][]string{}, svcs: map[string]*corev1.Service{}}
}

// Owners returns the keys of the Services that hold a.
func (s *State) Owners(a netip.Addr) []string {
	return slices.Clone(s.owner[a])
}

// sharingKey is the Service's lbipam.cilium.io/sharing-key (or alias).
func sharingKey(svc *corev1.Service) string {
	if v := svc.Annotations[ciliumv2.LBIPAMSharingKeyAnnotation]; v != "" {
		return v
	}
	return svc.Annotations[ciliumv2.LBIPAMSharingKeyAnnotationAlias]
}

// crossNamespace reports whether svc lets Services of namespace ns share
// its address (lbipam.cilium.io/sharing-cross-namespace: names or "*").
func crossNamespace(svc *corev1.Service, ns string) bool {
	v := svc.Annotations[ciliumv2.LBIPAMSharingCrossNamespaceAnnotation]
	if v == "" {
		v = svc.Annotations[ciliumv2.LBIPAMSharingCrossNamespaceAnnotationAlias]
	}
	for n := range strings.SplitSeq(v, ",") {
		if n = strings.TrimSpace(n); n == "*" || n == ns {
			return true
		}
	}
	return false
}

// sharable is Cilium's rule for two Services on one address: the same
// sharing key; the same namespace unless both allow the other's; no port
// with the same number and protocol; the same externalTrafficPolicy and,
// if Local, the same non-empty selector. The string says why not.
func sharable(a, b *corev1.Service) (bool, string) {
	if sharingKey(a) == "" || sharingKey(a) != sharingKey(b) {
		return false, "different sharing key"
	}
	if a.Namespace != b.Namespace && (!crossNamespace(a, b.Namespace) || !crossNamespace(b, a.Namespace)) {
		return false, "different and not permitted namespace"
	}
	for _, p1 := range a.Spec.Ports {
		for _, p2 := range b.Spec.Ports {
			if p1.Port == p2.Port && protoOf(p1) == protoOf(p2) {
				return false, "same port and protocol"
			}
		}
	}
	if a.Spec.ExternalTrafficPolicy != b.Spec.ExternalTrafficPolicy {
		return false, "different ExternalTrafficPolicy"
	}
	if a.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal &&
		(len(a.Spec.Selector) == 0 || !maps.Equal(a.Spec.Selector, b.Spec.Selector)) {
		return false, "compatible ExternalTrafficPolicy local but selecting different set of pods"
	}
	return true, ""
}

func protoOf(p corev1.ServicePort) corev1.Protocol {
	if p.Protocol == "" {
		return corev1.ProtocolTCP
	}
	return p.Protocol
}

// canShare reports whether svc may join the holders of a (none: yes).
func (s *State) canShare(svc *corev1.Service, holders []string) (bool, string) {
	for _, k := range holders {
		if k == k8stables.Key(svc) {
			continue
		}
		other := s.svcs[k]
		if other == nil {
			return false, "held by an unknown service"
		}
		if ok, why := sharable(svc, other); !ok {
			return false, why
		}
	}
	return true, ""
}

func (s *State) take(a netip.Addr, key string, h *held) {
	s.owner[a] = append(s.owner[a], key)
	h.ips = append(h.ips, a)
}

func (s *State) drop(a netip.Addr, key string) {
	rest := slices.DeleteFunc(s.owner[a], func(k string) bool { return k == key })
	if len(rest) == 0 {
		delete(s.owner, a)
	} else {
		s.owner[a] = rest
	}
}

// responsible is whether LB IPAM hands out the addresses of svc.
func (s *State) responsible(svc *corev1.Service) bool {
	if svc.Spec.Type != corev1.ServiceTypeLoadBalancer {
		return false
	}
	// Cilium also serves the classes of its BGP control plane and L2
	// announcer; cellium has neither.
	return svc.Spec.LoadBalancerClass == nil && s.DefaultLBIPAM
}

func svcLabels(svc *corev1.Service) labels.Set {
	l := make(labels.Set, len(svc.Labels)+2)
	for k, v := range svc.Labels {
		l[k] = v
	}
	l[ciliumv2.ServiceNameLabel] = svc.Name
	l[ciliumv2.ServiceNamespaceLabel] = svc.Namespace
	return l
}

// requestedIPs are the addresses a Service asks for: spec.loadBalancerIP
// and the lbipam.cilium.io/ips annotation (or its alias); unparsable
// entries are skipped.
func requestedIPs(svc *corev1.Service) []netip.Addr {
	var out []netip.Addr
	add := func(s string) {
		if a, err := netip.ParseAddr(strings.TrimSpace(s)); err == nil && !slices.Contains(out, a.Unmap()) {
			out = append(out, a.Unmap())
		}
	}
	if svc.Spec.LoadBalancerIP != "" {
		add(svc.Spec.LoadBalancerIP)
	}
	v := svc.Annotations[ciliumv2.LBIPAMIPsAnnotation]
	if v == "" {
		v = svc.Annotations[ciliumv2.LBIPAMIPsAnnotationAlias]
	}
	for s := range strings.SplitSeq(v, ",") {
		if strings.TrimSpace(s) != "" {
			add(s)
		}
	}
	return out
}

// wantsIPv4 is whether the Service's families include IPv4 (no families
// given: the cluster's default, IPv4 here).
func wantsIPv4(svc *corev1.Service) bool {
	return len(svc.Spec.IPFamilies) == 0 || slices.Contains(svc.Spec.IPFamilies, corev1.IPv4Protocol)
}

// hasOurCondition is whether svc carries LB IPAM's condition.
func hasOurCondition(svc *corev1.Service) bool {
	return slices.ContainsFunc(svc.Status.Conditions, func(c metav1.Condition) bool {
		return c.Type == ciliumv2.ServiceRequestSatisfiedCondition
	})
}

// Reconcile brings the state up to date with the pools, the nodes' pod
// CIDRs and the Services, and returns what every affected object's status
// should be. It is deterministic: the same inputs and state give the same
// outcome. Steps:
//
//  1. Pools are parsed; a pool overlapping an older one (creation time,
//     then name) or itself is conflicting; addresses overlapping a pod
//     CIDR are withheld.
//  2. Addresses of deleted Services, of Services no longer LB IPAM's and
//     addresses no longer valid for their Service (pool gone, selector no
//     longer matching, withheld, no longer requested, no longer sharable
//     with an older holder) are released.
//  3. Services seen for the first time (at start, after a restart) keep
//     the addresses their status already lists when valid and free; older
//     Services first.
//  4. Services without their addresses get them, older Services first:
//     the requested ones, else (with a sharing key) an address Services
//     of the same key hold that they may share, else the lowest free
//     address of the first active pool (creation order) that selects
//     them.
func (s *State) Reconcile(pools []*ciliumv2.CiliumLoadBalancerIPPool, podCIDRs []PodCIDR, services []*corev1.Service) Outcome {
	out := Outcome{Released: map[string][]netip.Addr{}, Problems: map[string][]string{}}
	ps := s.parsePools(pools, podCIDRs, out.Problems)

	svcs := slices.Clone(services)
	slices.SortFunc(svcs, func(a, b *corev1.Service) int {
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return cmp.Compare(k8stables.Key(a), k8stables.Key(b))
	})
	present := make(map[string]*corev1.Service, len(svcs))
	for _, svc := range svcs {
		present[k8stables.Key(svc)] = svc
	}

	// 2: release what deleted Services and Services no longer LB IPAM's
	// held, then check every held address again, older Services first:
	// an address stays with a Service if still valid for it and sharable
	// with the holders kept before it.
	for _, key := range slices.Sorted(mapsKeys(s.holders)) {
		h := s.holders[key]
		svc := present[key]
		if svc == nil || svc.UID != h.uid || !s.responsible(svc) {
			s.releaseAll(key, out.Released)
		}
	}
	s.svcs = present
	kept := map[netip.Addr][]string{}
	for _, svc := range svcs {
		key := k8stables.Key(svc)
		h := s.holders[key]
		if h == nil {
			continue
		}
		lbls, req := svcLabels(svc), requestedIPs(svc)
		still := h.ips[:0:0]
		for _, a := range h.ips {
			if ok, _ := s.canShare(svc, kept[a]); ok && validFor(ps, a, lbls, req, false) {
				still = append(still, a)
				kept[a] = append(kept[a], key)
			} else {
				out.Released[key] = append(out.Released[key], a)
			}
		}
		h.ips = still
	}
	s.owner = kept

	// 3: import what first-seen Services already have.
	for _, svc := range svcs {
		key := k8stables.Key(svc)
		if _, known := s.holders[key]; known || !s.responsible(svc) || !wantsIPv4(svc) {
			continue
		}
		h := &held{uid: svc.UID}
		s.holders[key] = h
		lbls, req := svcLabels(svc), requestedIPs(svc)
		for _, ing := range svc.Status.LoadBalancer.Ingress {
			a, err := netip.ParseAddr(ing.IP)
			if err != nil || !a.Is4() {
				continue
			}
			if ok, _ := s.canShare(svc, s.owner[a]); !ok || slices.Contains(h.ips, a) || !validFor(ps, a, lbls, req, false) {
				continue
			}
			if len(req) == 0 && len(h.ips) > 0 {
				continue // one address per Service without requests
			}
			s.take(a, key, h)
		}
	}

	// 4: allocate, and the outcome of every Service.
	for _, svc := range svcs {
		key := k8stables.Key(svc)
		if !s.responsible(svc) {
			if hasOurCondition(svc) || len(out.Released[key]) > 0 {
				out.Services = append(out.Services, ServiceOutcome{Service: svc})
			}
			continue
		}
		h := s.holders[key]
		if h == nil { // not IPv4
			h = &held{uid: svc.UID}
			s.holders[key] = h
		}
		if len(ps) == 0 && len(h.ips) == 0 && !hasOurCondition(svc) && len(out.Released[key]) == 0 {
			continue // dormant without pools, as Cilium
		}
		o := ServiceOutcome{Service: svc, Responsible: true}
		o.Satisfied, o.Reason, o.Message = s.satisfy(ps, svc, key, h)
		o.IPs = slices.Clone(h.ips)
		out.Services = append(out.Services, o)
	}

	for _, p := range ps {
		out.Pools = append(out.Pools, s.counts(p))
	}
	return out
}

func mapsKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func addrKeys[V any](m map[netip.Addr]V) func(func(netip.Addr) bool) {
	return func(yield func(netip.Addr) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func (s *State) releaseAll(key string, released map[string][]netip.Addr) {
	for _, a := range s.holders[key].ips {
		s.drop(a, key)
		released[key] = append(released[key], a)
	}
	delete(s.holders, key)
}

// validFor is whether a Service with labels lbls that requested req may
// hold a: a usable address of a pool that selects it (activeOnly: of an
// active pool), and one of req if it requested any.
func validFor(ps []*pool, a netip.Addr, lbls labels.Set, req []netip.Addr, activeOnly bool) bool {
	if len(req) > 0 && !slices.Contains(req, a) {
		return false
	}
	for _, p := range ps {
		if (!activeOnly || p.active()) && p.selects(lbls) && p.usable(a) {
			return true
		}
	}
	return false
}

// satisfy gives svc what it lacks and returns its condition.
func (s *State) satisfy(ps []*pool, svc *corev1.Service, key string, h *held) (bool, string, string) {
	if !wantsIPv4(svc) {
		return false, reasonNoPool, "cellium's LB IPAM hands out IPv4 addresses only"
	}
	lbls := svcLabels(svc)
	if req := requestedIPs(svc); len(req) > 0 {
		reason, msg := "", ""
		for _, a := range req {
			if slices.Contains(h.ips, a) {
				continue
			}
			switch {
			case !a.Is4():
				reason, msg = reasonNoPool, fmt.Sprintf("The IP '%s' is not IPv4: cellium's LB IPAM hands out IPv4 addresses only", a)
			case validFor(ps, a, lbls, nil, true):
				if holders := s.owner[a]; len(holders) > 0 {
					if sharingKey(svc) == "" {
						reason, msg = reasonAlreadyAlloc, fmt.Sprintf("The IP '%s' is already allocated to another service", a)
						continue
					}
					if ok, why := s.canShare(svc, holders); !ok {
						reason, msg = reasonAlreadyAllocIncompatible, fmt.Sprintf("The IP '%s' is already allocated to an incompatible service. Reason: %s", a, why)
						continue
					}
				}
				s.take(a, key, h)
			case slices.ContainsFunc(ps, func(p *pool) bool { return p.active() && p.usable(a) }):
				reason, msg = reasonSelectorMismatch, fmt.Sprintf("The pool with the CIDR containing '%s', doesn't select this service", a)
			default:
				reason, msg = reasonNoPool, fmt.Sprintf("No pool exists with a CIDR containing '%s'", a)
				if slices.ContainsFunc(ps, func(p *pool) bool { return p.podOverlapContains(a) }) {
					msg += " that may be handed out: it overlaps a node's pod CIDR"
				}
			}
		}
		if reason != "" {
			return false, reason, msg
		}
		return true, reasonSatisfied, ""
	}
	if len(h.ips) > 0 {
		return true, reasonSatisfied, ""
	}
	// With a sharing key: an address Services of the same key hold, if
	// this one may share it (lowest first).
	if sharingKey(svc) != "" {
		for _, a := range slices.SortedFunc(addrKeys(s.owner), netip.Addr.Compare) {
			if holders := s.owner[a]; s.svcs[holders[0]] != nil && sharingKey(s.svcs[holders[0]]) == sharingKey(svc) && validFor(ps, a, lbls, nil, true) {
				if ok, _ := s.canShare(svc, holders); ok {
					s.take(a, key, h)
					return true, reasonSatisfied, ""
				}
			}
		}
	}
	full := false
	for _, p := range ps {
		if !p.active() || !p.selects(lbls) {
			continue
		}
		if a, ok := s.firstFree(p); ok {
			s.take(a, key, h)
			return true, reasonSatisfied, ""
		}
		full = true
	}
	if full {
		return false, reasonOutOfIPs, "All enabled CiliumLoadBalancerIPPools that match this service ran out of allocatable IPs"
	}
	return false, reasonNoPool, "There are no enabled CiliumLoadBalancerIPPools that match this service"
}

func (p *pool) podOverlapContains(a netip.Addr) bool {
	return slices.ContainsFunc(p.withheld, func(w ipRange) bool { return w.contains(a) })
}

// firstFree returns the lowest usable address of p no Service holds.
func (s *State) firstFree(p *pool) (netip.Addr, bool) {
	for _, r := range p.ranges {
		for a := r.from; ; a = a.Next() {
			if _, taken := s.owner[a]; !taken && p.usable(a) {
				return a, true
			}
			if a == r.to {
				break
			}
		}
	}
	return netip.Addr{}, false
}

// counts computes a pool's IPsTotal, IPsUsed and IPsAvailable: as in
// Cilium, reserved first and last addresses count as used; so do the
// addresses withheld for a pod-CIDR overlap.
func (s *State) counts(p *pool) PoolOutcome {
	o := PoolOutcome{Pool: p.obj, Conflict: p.conflict, PodCIDROverlap: p.podOverlap}
	for _, r := range mergeRanges(p.ranges) {
		o.Total += r.size()
	}
	unusable := map[netip.Addr]bool{}
	for a := range p.reserved {
		unusable[a] = true
	}
	var withheld uint64
	for _, w := range mergeRanges(p.withheld) {
		withheld += w.size()
		for a := range p.reserved {
			if w.contains(a) {
				delete(unusable, a)
			}
		}
	}
	o.Used = uint64(len(unusable)) + withheld
	for a := range s.owner {
		if p.usable(a) {
			o.Used++
		}
	}
	o.Available = o.Total - min(o.Used, o.Total)
	return o
}

// mergeRanges returns the union of rs as disjoint sorted ranges.
func mergeRanges(rs []ipRange) []ipRange {
	rs = slices.Clone(rs)
	slices.SortFunc(rs, func(a, b ipRange) int { return a.from.Compare(b.from) })
	var out []ipRange
	for _, r := range rs {
		if n := len(out); n > 0 && (out[n-1].overlaps(r) || out[n-1].to.Next() == r.from) {
			if out[n-1].to.Less(r.to) {
				out[n-1].to = r.to
			}
			continue
		}
		out = append(out, r)
	}
	return out
}

// parsePools parses the pools, in creation order, and marks conflicts
// and pod-CIDR overlaps.
func (s *State) parsePools(objs []*ciliumv2.CiliumLoadBalancerIPPool, podCIDRs []PodCIDR, problems map[string][]string) []*pool {
	objs = slices.Clone(objs)
	slices.SortFunc(objs, func(a, b *ciliumv2.CiliumLoadBalancerIPPool) int {
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return cmp.Compare(a.Name, b.Name)
	})
	var ps []*pool
	for _, obj := range objs {
		p, probs := parsePool(obj)
		if len(probs) > 0 {
			problems[obj.Name] = probs
		}
		// Overlaps within the pool, then with older pools that are not
		// conflicting themselves.
	inner:
		for i, r := range p.ranges {
			for _, r2 := range p.ranges[i+1:] {
				if r.overlaps(r2) {
					p.conflict = fmt.Sprintf("Pool conflicts since range '%s' overlaps range '%s' from IP Pool '%s'", r, r2, obj.Name)
					break inner
				}
			}
		}
	outer:
		for _, older := range ps {
			if p.conflict != "" {
				break
			}
			if older.conflict != "" {
				continue
			}
			for _, r := range p.ranges {
				for _, r2 := range older.ranges {
					if r.overlaps(r2) {
						p.conflict = fmt.Sprintf("Pool conflicts since range '%s' overlaps range '%s' from IP Pool '%s'", r, r2, older.name())
						break outer
					}
				}
			}
		}
		var msgs []string
		for _, pc := range podCIDRs {
			if !pc.Prefix.Addr().Is4() {
				continue
			}
			pr := prefixRange(pc.Prefix)
			for _, r := range p.ranges {
				if !r.overlaps(pr) {
					continue
				}
				clip := ipRange{maxAddr(r.from, pr.from), minAddr(r.to, pr.to)}
				p.withheld = append(p.withheld, clip)
				msgs = append(msgs, fmt.Sprintf("range '%s' overlaps the pod CIDR %s of node %s", r, pc.Prefix.Masked(), pc.Node))
			}
		}
		if len(msgs) > 0 {
			slices.Sort(msgs)
			msgs = slices.Compact(msgs)
			p.podOverlap = strings.Join(msgs, "; ") + ": these addresses are not handed out"
		}
		ps = append(ps, p)
	}
	return ps
}

func maxAddr(a, b netip.Addr) netip.Addr {
	if a.Less(b) {
		return b
	}
	return a
}

func minAddr(a, b netip.Addr) netip.Addr {
	if a.Less(b) {
		return a
	}
	return b
}
