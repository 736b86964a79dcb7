package ipcache

import (
	"net/netip"

	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/ipcache"
)

// state holds every source's claims, by owner and by prefix, and picks the
// winner of each prefix. It is the deriver's private memory; only the
// deriver's goroutine touches it.
type state struct {
	byOwner  map[string]claims
	byPrefix map[netip.Prefix]ownerClaims
	// cidrs are the prefixes policy CIDR rules name, with their CIDR
	// identities: a row inside one (a pod's address in an ipBlock) carries
	// the most specific one's identity as its CIDRIdentity.
	cidrs map[netip.Prefix]identity.NumericIdentity
}

// ownerClaims are the claims of one prefix, one per owner (a slice for
// the reason claims is one: most prefixes have one owner).
type ownerClaims []ownerClaim

// ownerClaim is one owner's claim of a prefix.
type ownerClaim struct {
	owner string
	claim claim
}

// without returns o without owner's claim; it may reuse o's array.
func (o ownerClaims) without(owner string) ownerClaims {
	for i := range o {
		if o[i].owner == owner {
			last := len(o) - 1
			o[i] = o[last]
			o[last] = ownerClaim{}
			return o[:last]
		}
	}
	return o
}

// with returns o with owner's claim cl; it may reuse o's array.
func (o ownerClaims) with(owner string, cl claim) ownerClaims {
	for i := range o {
		if o[i].owner == owner {
			o[i].claim = cl
			return o
		}
	}
	return append(o, ownerClaim{owner: owner, claim: cl})
}

func newState() *state {
	return &state{byOwner: map[string]claims{}, byPrefix: map[netip.Prefix]ownerClaims{},
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
	if old.equal(c) {
		return
	}
	for _, pc := range old {
		p := pc.prefix
		if _, keep := c.get(p); keep {
			continue
		}
		touched[p] = struct{}{}
		if rest := s.byPrefix[p].without(owner); len(rest) == 0 {
			delete(s.byPrefix, p)
		} else {
			s.byPrefix[p] = rest
		}
	}
	for _, pc := range c {
		p, cl := pc.prefix, pc.claim
		if o, ok := old.get(p); ok && o == cl {
			continue
		}
		touched[p] = struct{}{}
		s.byPrefix[p] = s.byPrefix[p].with(owner, cl)
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
	for _, oc := range s.byPrefix[p] {
		owner, cl := oc.owner, oc.claim
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
	for _, oc := range s.byPrefix[p] {
		cl := oc.claim
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
