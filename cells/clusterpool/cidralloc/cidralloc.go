package cidralloc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
)

// Flag names and defaults of the operator's cluster-pool IPv4 options.
const (
	FlagIPv4CIDR        = "cluster-pool-ipv4-cidr"
	FlagIPv4MaskSize    = "cluster-pool-ipv4-mask-size"
	DefaultIPv4CIDR     = "10.0.0.0/8"
	DefaultIPv4MaskSize = 24

	// MaxNodeCIDRBits bounds mask size minus cluster prefix length: one
	// cluster CIDR is split into at most 2^16 node CIDRs.
	MaxNodeCIDRBits = 16
	// MaxMaskSize is the longest node CIDR: a /30 still holds a network,
	// router, pod and broadcast address.
	MaxMaskSize = 30
)

// Errors returned by Allocator methods, wrapped with details; test with
// errors.Is.
var (
	// ErrPoolExhausted means every node CIDR of every cluster CIDR is
	// allocated. The wrapping message names the cluster CIDRs and sizes.
	ErrPoolExhausted = errors.New("cluster pool exhausted")
	// ErrNotInPool means a CIDR is not one of the pool's node CIDRs: it is
	// outside the cluster CIDRs, not IPv4, has host bits set, or its
	// length differs from the mask size.
	ErrNotInPool = errors.New("CIDR not in the cluster pool")
	// ErrInUse means a node CIDR is allocated to another node.
	ErrInUse = errors.New("CIDR allocated to another node")
	// ErrEmptyNode means a node name was empty.
	ErrEmptyNode = errors.New("empty node name")
)

// Config holds the operator's cluster-pool IPv4 options.
type Config struct {
	// IPv4CIDRs are the cluster CIDRs node CIDRs are carved from
	// (--cluster-pool-ipv4-cidr).
	IPv4CIDRs []string
	// IPv4MaskSize is the prefix length of each node CIDR
	// (--cluster-pool-ipv4-mask-size).
	IPv4MaskSize int
}

// DefaultConfig returns the defaults: 10.0.0.0/8 split into /24s.
func DefaultConfig() Config {
	return Config{IPv4CIDRs: []string{DefaultIPv4CIDR}, IPv4MaskSize: DefaultIPv4MaskSize}
}

// Validate checks the options and returns the parsed cluster CIDRs. Every
// error names the flag to fix.
//
// Possible errors: no CIDR; a CIDR that does not parse, is IPv6 or has host
// bits set; overlapping CIDRs; a mask size that is not longer than every
// cluster CIDR's prefix, is longer than MaxMaskSize, or splits a cluster
// CIDR into more than 2^MaxNodeCIDRBits node CIDRs.
func (c Config) Validate() ([]netip.Prefix, error) {
	if len(c.IPv4CIDRs) == 0 {
		return nil, fmt.Errorf("--%s: no CIDR given", FlagIPv4CIDR)
	}
	var prefixes []netip.Prefix
	for _, s := range c.IPv4CIDRs {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		switch {
		case err != nil:
			return nil, fmt.Errorf("--%s: %w", FlagIPv4CIDR, err)
		case !p.Addr().Is4():
			return nil, fmt.Errorf("--%s: %v is not an IPv4 CIDR (IPv6 pods use --cluster-pool-ipv6-cidr)", FlagIPv4CIDR, p)
		case p != p.Masked():
			return nil, fmt.Errorf("--%s: %v has host bits set; did you mean %v?", FlagIPv4CIDR, p, p.Masked())
		}
		for _, prev := range prefixes {
			if prev.Overlaps(p) {
				return nil, fmt.Errorf("--%s: %v overlaps %v", FlagIPv4CIDR, p, prev)
			}
		}
		prefixes = append(prefixes, p)
	}
	m := c.IPv4MaskSize
	if m > MaxMaskSize {
		return nil, fmt.Errorf("--%s=%d: must be at most %d, a node CIDR needs room for network, router, pod and broadcast addresses",
			FlagIPv4MaskSize, m, MaxMaskSize)
	}
	for _, p := range prefixes {
		if m <= p.Bits() {
			return nil, fmt.Errorf("--%s=%d: must be larger than the prefix length of %v (--%s), so that it splits into node CIDRs",
				FlagIPv4MaskSize, m, p, FlagIPv4CIDR)
		}
		if m-p.Bits() > MaxNodeCIDRBits {
			return nil, fmt.Errorf("--%s=%d: splits %v (--%s) into 2^%d node CIDRs, at most 2^%d are allowed; use a mask size of at most %d or a smaller cluster CIDR",
				FlagIPv4MaskSize, m, p, FlagIPv4CIDR, m-p.Bits(), MaxNodeCIDRBits, p.Bits()+MaxNodeCIDRBits)
		}
	}
	return prefixes, nil
}

// Allocator carves per-node pod CIDRs out of the cluster CIDRs. Each node
// gets one node CIDR from Allocate; nodes restored with Occupy may hold
// several. Allocate walks the cluster CIDRs in order and hands out the next
// free node CIDR after the last one it handed out, wrapping around, so a
// released node CIDR is not reused before the others.
//
// An Allocator is safe for concurrent use.
type Allocator struct {
	maskSize int

	mu     sync.Mutex
	sets   []*cidrSet
	byNode map[string][]netip.Prefix // in the order acquired
	used   int
	total  int
	// next position for Allocate: set index and slot within it.
	nextSet, nextSlot int
}

// cidrSet is one cluster CIDR; slot i is its i-th node CIDR, owned by the
// node named in owners[i] ("" when free).
type cidrSet struct {
	prefix netip.Prefix
	base   uint32
	owners []string
	free   int
}

// New validates cfg and returns an allocator with nothing allocated.
//
// Possible errors: those of Config.Validate.
func New(cfg Config) (*Allocator, error) {
	prefixes, err := cfg.Validate()
	if err != nil {
		return nil, err
	}
	a := &Allocator{maskSize: cfg.IPv4MaskSize, byNode: make(map[string][]netip.Prefix)}
	for _, p := range prefixes {
		n := 1 << (cfg.IPv4MaskSize - p.Bits())
		a.sets = append(a.sets, &cidrSet{
			prefix: p,
			base:   binary.BigEndian.Uint32(p.Addr().AsSlice()),
			owners: make([]string, n),
			free:   n,
		})
		a.total += n
	}
	return a, nil
}

// MaskSize returns the prefix length of the node CIDRs.
func (a *Allocator) MaskSize() int { return a.maskSize }

// ClusterCIDRs returns the cluster CIDRs in configuration order.
func (a *Allocator) ClusterCIDRs() []netip.Prefix {
	out := make([]netip.Prefix, len(a.sets))
	for i, s := range a.sets {
		out[i] = s.prefix
	}
	return out
}

func (a *Allocator) nodeCIDR(s *cidrSet, slot int) netip.Prefix {
	v := s.base + uint32(slot)<<(32-a.maskSize)
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v)
	return netip.PrefixFrom(netip.AddrFrom4(b), a.maskSize)
}

// Allocate returns the node's CIDR, allocating one if it has none. A node
// that already holds CIDRs gets the first of them again.
//
// Possible errors: ErrEmptyNode; ErrPoolExhausted, wrapped in a message that
// names the cluster CIDRs and how many node CIDRs they hold.
func (a *Allocator) Allocate(node string) (netip.Prefix, error) {
	if node == "" {
		return netip.Prefix{}, fmt.Errorf("allocate node CIDR: %w", ErrEmptyNode)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if held := a.byNode[node]; len(held) > 0 {
		return held[0], nil
	}
	if a.used == a.total {
		return netip.Prefix{}, a.exhaustedError(node)
	}
	for n := 0; n <= len(a.sets); n++ {
		si := (a.nextSet + n) % len(a.sets)
		s := a.sets[si]
		if s.free == 0 {
			continue
		}
		start := 0
		if n == 0 {
			start = a.nextSlot
		}
		for slot := start; slot < len(s.owners); slot++ {
			if s.owners[slot] == "" {
				a.nextSet, a.nextSlot = si, slot+1
				return a.take(s, slot, node), nil
			}
		}
	}
	// Unreachable while used and the owner slices agree.
	return netip.Prefix{}, a.exhaustedError(node)
}

func (a *Allocator) take(s *cidrSet, slot int, node string) netip.Prefix {
	s.owners[slot] = node
	s.free--
	a.used++
	c := a.nodeCIDR(s, slot)
	a.byNode[node] = append(a.byNode[node], c)
	return c
}

func (a *Allocator) exhaustedError(node string) error {
	return fmt.Errorf("allocate node CIDR for %q: %w: all %d /%d node CIDRs of %v are allocated; add a CIDR to --%s or remove nodes",
		node, ErrPoolExhausted, a.total, a.maskSize, a.ClusterCIDRs(), FlagIPv4CIDR)
}

// locate returns the set and slot of a node CIDR. Its errors do not repeat
// the CIDR: callers wrap them with it.
func (a *Allocator) locate(c netip.Prefix) (*cidrSet, int, error) {
	switch {
	case !c.IsValid() || !c.Addr().Is4():
		return nil, 0, fmt.Errorf("not an IPv4 CIDR: %w", ErrNotInPool)
	case c != c.Masked():
		return nil, 0, fmt.Errorf("host bits set: %w", ErrNotInPool)
	case c.Bits() != a.maskSize:
		return nil, 0, fmt.Errorf("not a /%d (--%s): %w", a.maskSize, FlagIPv4MaskSize, ErrNotInPool)
	}
	for _, s := range a.sets {
		if s.prefix.Contains(c.Addr()) {
			off := binary.BigEndian.Uint32(c.Addr().AsSlice()) - s.base
			return s, int(off >> (32 - a.maskSize)), nil
		}
	}
	return nil, 0, fmt.Errorf("outside %v (--%s): %w", a.ClusterCIDRs(), FlagIPv4CIDR, ErrNotInPool)
}

// Occupy records that node holds cidr, to restore the podCIDRs of existing
// CiliumNodes when the operator starts. Occupying a CIDR the node already
// holds succeeds and changes nothing; a node may hold several.
//
// Possible errors: ErrEmptyNode; ErrNotInPool; ErrInUse, naming the node
// that holds the CIDR.
func (a *Allocator) Occupy(node string, cidr netip.Prefix) error {
	if node == "" {
		return fmt.Errorf("occupy %v: %w", cidr, ErrEmptyNode)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	s, slot, err := a.locate(cidr)
	if err != nil {
		return fmt.Errorf("occupy %v for node %q: %w", cidr, node, err)
	}
	switch owner := s.owners[slot]; owner {
	case node:
		return nil
	case "":
		a.take(s, slot, node)
		return nil
	default:
		return fmt.Errorf("occupy %v for node %q: held by node %q: %w", cidr, node, owner, ErrInUse)
	}
}

// Release frees every CIDR of node. Releasing a node without CIDRs is not
// an error.
func (a *Allocator) Release(node string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, c := range a.byNode[node] {
		s, slot, err := a.locate(c)
		if err != nil {
			continue // cannot happen: only located CIDRs are recorded
		}
		s.owners[slot] = ""
		s.free++
		a.used--
	}
	delete(a.byNode, node)
}

// Lookup returns the CIDRs node holds, in the order it acquired them.
func (a *Allocator) Lookup(node string) []netip.Prefix {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.byNode[node])
}

// Dump returns every node with the CIDRs it holds.
func (a *Allocator) Dump() map[string][]netip.Prefix {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[string][]netip.Prefix, len(a.byNode))
	for n, cs := range a.byNode {
		out[n] = slices.Clone(cs)
	}
	return out
}

// Used returns how many node CIDRs are allocated.
func (a *Allocator) Used() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.used
}

// Capacity returns how many node CIDRs the cluster CIDRs hold in total.
func (a *Allocator) Capacity() int { return a.total }
