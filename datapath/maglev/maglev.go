package maglev

import (
	"crypto/sha256"
	"encoding/binary"
	"slices"
	"strings"
)

// Backend is one backend of a table: Name identifies it the same way on
// every node (its address, "10.0.1.5:8080/TCP"), ID is what the table's
// slots hold (the node's backend ID).
type Backend struct {
	Name string
	ID   uint32
}

// permutation is where a backend's preference list starts (offset) and
// its stride (skip), both below the table size m; skip is never 0, and m
// being prime, the list visits every slot once.
func permutation(seed Seed, name string, m uint64) (offset, skip uint64) {
	h := sha256.New()
	h.Write(seed[:])
	h.Write([]byte(name))
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	h1 := binary.BigEndian.Uint64(sum[0:8])
	h2 := binary.BigEndian.Uint64(sum[8:16])
	return h1 % m, h2%(m-1) + 1
}

// Table returns the lookup table of size m (a prime, ValidTableSize) for
// backends: m backend IDs. The backends are taken in the order of their
// names (so the input order does not matter), and in turn each takes the
// next free slot of its permutation until every slot is taken; each
// backend gets m/N or m/N+1 slots. Names must be distinct. No backends
// (or m < 2) give nil.
func Table(m uint32, seed Seed, backends []Backend) []uint32 {
	n := len(backends)
	if n == 0 || m < 2 {
		return nil
	}
	bs := slices.Clone(backends)
	slices.SortFunc(bs, func(a, b Backend) int { return strings.Compare(a.Name, b.Name) })
	mm := uint64(m)
	pos := make([]uint64, n)
	skip := make([]uint64, n)
	for i, b := range bs {
		pos[i], skip[i] = permutation(seed, b.Name, mm)
	}
	table := make([]uint32, m)
	taken := make([]bool, m)
	for filled := uint32(0); ; {
		for i := range bs {
			c := pos[i]
			for taken[c] {
				c += skip[i]
				if c >= mm {
					c -= mm
				}
			}
			table[c], taken[c] = bs[i].ID, true
			c += skip[i]
			if c >= mm {
				c -= mm
			}
			pos[i] = c
			if filled++; filled == m {
				return table
			}
		}
	}
}
