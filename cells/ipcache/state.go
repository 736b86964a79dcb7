package ipcache

import (
	"maps"
	"net/netip"

	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/ipcache"
)

// state holds every source's claims, by owner and by prefix, and picks the
// winner of each prefix. It is the deriver's private memory; only the
// deriver's goroutine touches it.
type state struct {
	byOwner  map[string]claims
	byPrefix map[netip.Prefix]map[string]claim
	// cidrs are the prefixes policy CIDR rules name, with their CIDR
	// identities: a row inside one (a pod's address in an ipBlock) carries
	// the most specific one's identity as its CIDRIdentity.
	cidrs map[netip.Prefix]identity.NumericIdentity
}

func newState() *state {
	return &state{byOwner: map[string]claims{}, byPrefix: map[netip.Prefix]map[string]claim{},
		cidrs: map[netip.Prefix]identity.NumericIdentity{}}
}

// setCIDR records (ok) or forgets the policy CIDR prefix p with identity
// id, and adds every claimed prefix inside p to touched: their
// CIDRIdentity may change.
func (s *state) setCIDR(p netip.Prefix, id identity.NumericIdentity, ok bool, touched map[netip.Prefix]struct{}) {
	old, had := s.cidrs[p]
	if had == ok && old == id {
		return
	}
	if ok {
		s.cidrs[p] = id
	} else {
		delete(s.cidrs, p)
	}
	for q := range s.byPrefix {
		if q.Bits() >= p.Bits() && p.Contains(q.Addr()) {
			touched[q] = struct{}{}
		}
	}
}

// cidrFor returns the identity of the most specific policy CIDR prefix
// that holds p (p itself included), or 0.
func (s *state) cidrFor(p netip.Prefix) identity.NumericIdentity {
	bits, id := -1, identity.NumericIdentity(0)
	for c, cid := range s.cidrs {
		if c.Bits() <= p.Bits() && c.Bits() > bits && c.Contains(p.Addr()) {
			bits, id = c.Bits(), cid
		}
	}
	return id
}

// set replaces the claims of owner (none: the owner is gone) and adds the
// prefixes whose claims changed to touched.
func (s *state) set(owner string, c claims, touched map[netip.Prefix]struct{}) {
	old := s.byOwner[owner]
	if maps.Equal(old, c) {
		return
	}
	for p := range old {
		if _, keep := c[p]; keep {
			continue
		}
		touched[p] = struct{}{}
		delete(s.byPrefix[p], owner)
		if len(s.byPrefix[p]) == 0 {
			delete(s.byPrefix, p)
		}
	}
	for p, cl := range c {
		if o, ok := old[p]; ok && o == cl {
			continue
		}
		touched[p] = struct{}{}
		m := s.byPrefix[p]
		if m == nil {
			m = map[string]claim{}
			s.byPrefix[p] = m
		}
		m[owner] = cl
	}
	if len(c) == 0 {
		delete(s.byOwner, owner)
	} else {
		s.byOwner[owner] = c
	}
}

// winner returns the row of prefix p: the claim of the highest source
// precedence, with the identity of the most specific policy CIDR holding p
// unless the claim is that CIDR's own. False when nobody claims p (it is
// world).
//
// Between claims of one source, equal claims (identity and host IP) are
// one claim; the owner that sorts first only names the row. Claims of
// CiliumEndpoints that differ cancel each other out (see cepConflict): a
// CEP's name is chosen by whoever writes it, so it must not decide which
// identity an address has. Other sources are this node's own knowledge
// or one object per address, where the owner that sorts first wins.
func (s *state) winner(p netip.Prefix) (*ipcache.Entry, bool) {
	best, bestOwner, found := s.best(p, s.cepConflict(p))
	if !found {
		return nil, false
	}
	e := &ipcache.Entry{Prefix: p, Identity: best.id, Source: best.source, Owner: bestOwner, HostIP: best.hostIP,
		ServiceFrontend: best.source == ipcache.SourceServiceFrontend, NodeBootID: best.bootID}
	if best.source != ipcache.SourcePolicyCIDR {
		// A policy CIDR that holds the prefix lost to a more precise
		// source (the endpoint of a pod whose address an ipBlock names):
		// the datapath matches CIDR rules on it too.
		e.CIDRIdentity = s.cidrFor(p)
	}
	return e, true
}

// best returns the claim of p of the highest precedence (between equals,
// the owner that sorts first), leaving the CiliumEndpoints' out if
// withoutCEPs.
func (s *state) best(p netip.Prefix, withoutCEPs bool) (best claim, bestOwner string, found bool) {
	for owner, cl := range s.byPrefix[p] {
		if withoutCEPs && cl.source == ipcache.SourceCiliumEndpoint {
			continue
		}
		bp, cp := best.source.Precedence(), cl.source.Precedence()
		if !found || cp > bp || (cp == bp && owner < bestOwner) {
			best, bestOwner, found = cl, owner, true
		}
	}
	return best, bestOwner, found
}

// disagree reports whether two claims of source for p differ.
func (s *state) disagree(p netip.Prefix, source ipcache.Source) bool {
	var (
		first claim
		seen  bool
	)
	for _, cl := range s.byPrefix[p] {
		if cl.source != source {
			continue
		}
		if seen && cl != first {
			return true
		}
		first, seen = cl, true
	}
	return false
}

// cepConflict reports whether CiliumEndpoints would decide p's row but
// disagree about it, so that none of them does. Each of them passed every
// check (a refused CEP claims nothing), so the attacker's CEP cannot be
// told from the honest one: any rule that picked one (the older, the
// newer, the lower UID) would let an attacker who may write CEPs win by
// timing or by retrying. Until one of them goes, p is what the sources
// below say (a policy CIDR) or world.
func (s *state) cepConflict(p netip.Prefix) bool {
	best, _, found := s.best(p, false)
	return found && best.source == ipcache.SourceCiliumEndpoint && s.disagree(p, ipcache.SourceCiliumEndpoint)
}
