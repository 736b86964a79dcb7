package policy

import (
	"slices"

	"github.com/cellium/cellium/statedb/identity"
)

func identityOf(id uint32) identity.NumericIdentity { return identity.NumericIdentity(id) }

func sortEntries(es []Entry) {
	slices.SortFunc(es, func(a, b Entry) int { return a.Key.Compare(b.Key) })
}
