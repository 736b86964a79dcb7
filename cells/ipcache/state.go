package ipcache

import (
	"maps"
	"net/netip"

	"github.com/cellium/cellium/statedb/ipcache"
)

// state holds every source's claims, by owner and by prefix, and picks the
// winner of each prefix. It is the deriver's private memory; only the
// deriver's goroutine touches it.
type state struct {
	byOwner  map[string]claims
	byPrefix map[netip.Prefix]map[string]claim
}

func newState() *state {
	return &state{byOwner: map[string]claims{}, byPrefix: map[netip.Prefix]map[string]claim{}}
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
// precedence, between equals the one whose owner sorts first. False when
// nobody claims p (it is world).
func (s *state) winner(p netip.Prefix) (*ipcache.Entry, bool) {
	var (
		best      claim
		bestOwner string
		found     bool
	)
	for owner, cl := range s.byPrefix[p] {
		bp, cp := best.source.Precedence(), cl.source.Precedence()
		if !found || cp > bp || (cp == bp && owner < bestOwner) {
			best, bestOwner, found = cl, owner, true
		}
	}
	if !found {
		return nil, false
	}
	return &ipcache.Entry{Prefix: p, Identity: best.id, Source: best.source, Owner: bestOwner, HostIP: best.hostIP}, true
}
