package pool

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"net/netip"
	"strings"
	"sync"

	ipamtables "github.com/cellium/cellium/statedb/ipam"
)

// RouterOwner is the owner recorded for the router IP (see Pool.RouterIP).
const RouterOwner = ipamtables.RouterOwner

// Prefix lengths a pod CIDR may have.
const (
	// MinPrefixBits is the shortest accepted prefix (a /8: 2^24 addresses).
	MinPrefixBits = 8
	// MaxPrefixBits is the longest accepted prefix (a /30: network,
	// router, one pod address, broadcast).
	MaxPrefixBits = 30
)

// Errors returned by Pool methods, wrapped with details; test with
// errors.Is.
var (
	// ErrPoolExhausted means every usable address of every CIDR is
	// allocated. The wrapping message names the CIDRs and their size.
	ErrPoolExhausted = errors.New("IP pool exhausted")
	// ErrNotInPool means the address is outside the pool's CIDRs or is a
	// network or broadcast address.
	ErrNotInPool = errors.New("IP not in pool")
	// ErrInUse means the address is allocated to another owner.
	ErrInUse = errors.New("IP already allocated")
	// ErrReserved means the address is the router IP, which is never
	// released.
	ErrReserved = errors.New("IP reserved for the router")
	// ErrEmptyOwner means an allocation was asked for without an owner.
	ErrEmptyOwner = errors.New("empty owner")
)

// Pool hands out the IPv4 addresses of a node's pod CIDRs.
//
// In every CIDR the network and broadcast addresses are never handed out.
// The first usable address of the first CIDR (10.0.1.1 in 10.0.1.0/24) is
// reserved at construction for the node's router, the address the
// cilium_host interface carries, with owner RouterOwner.
//
// Allocate walks the CIDRs in order and hands out the next free address
// after the one it handed out last, wrapping around, so that a released
// address is not reused before the others are: connections and caches that
// still remember a deleted pod's address do not hit its successor at once.
//
// A Pool is safe for concurrent use.
type Pool struct {
	router netip.Addr

	mu     sync.Mutex
	ranges []*cidrRange // in the order given to New
	owners map[netip.Addr]string
	used   int // allocated usable addresses, router included
	usable int // usable addresses in all ranges
	// next position for Allocate: range index and offset within it.
	nextRange int
	nextOff   uint32
}

// cidrRange is one CIDR with a bitmap over all its addresses; bits for the
// network and broadcast addresses (and past the end in the last word) are
// always set.
type cidrRange struct {
	prefix netip.Prefix
	base   uint32 // the network address
	size   uint32 // number of addresses
	free   int    // usable addresses not allocated
	bitmap []uint64
}

// New returns a pool over the given CIDRs with the router IP reserved.
//
// Possible errors: no CIDR; a CIDR that is not IPv4, has host bits set, or
// whose length is outside MinPrefixBits..MaxPrefixBits; overlapping CIDRs.
func New(cidrs ...netip.Prefix) (*Pool, error) {
	if len(cidrs) == 0 {
		return nil, errors.New("new IP pool: no pod CIDR")
	}
	p := &Pool{owners: make(map[netip.Addr]string)}
	for i, c := range cidrs {
		switch {
		case !c.IsValid():
			return nil, fmt.Errorf("new IP pool: invalid CIDR %v", c)
		case !c.Addr().Is4():
			return nil, fmt.Errorf("new IP pool: %v is not an IPv4 CIDR", c)
		case c != c.Masked():
			return nil, fmt.Errorf("new IP pool: %v has host bits set, the CIDR is %v", c, c.Masked())
		case c.Bits() < MinPrefixBits || c.Bits() > MaxPrefixBits:
			return nil, fmt.Errorf("new IP pool: %v: prefix length must be between /%d and /%d", c, MinPrefixBits, MaxPrefixBits)
		}
		for _, prev := range cidrs[:i] {
			if prev.Overlaps(c) {
				return nil, fmt.Errorf("new IP pool: %v overlaps %v", c, prev)
			}
		}
		r := newRange(c)
		p.ranges = append(p.ranges, r)
		p.usable += r.free
	}
	first := p.ranges[0]
	p.router = addrFrom(first.base + 1)
	first.set(1)
	p.owners[p.router] = RouterOwner
	p.used = 1
	p.nextOff = 2
	return p, nil
}

func newRange(c netip.Prefix) *cidrRange {
	size := uint32(1) << (32 - c.Bits())
	r := &cidrRange{
		prefix: c,
		base:   binary.BigEndian.Uint32(c.Addr().AsSlice()),
		size:   size,
		free:   int(size) - 2,
		bitmap: make([]uint64, (size+63)/64),
	}
	r.set(0)
	r.set(size - 1)
	for off := size; off < uint32(len(r.bitmap))*64; off++ {
		r.set(off)
	}
	return r
}

func (r *cidrRange) set(off uint32)        { r.bitmap[off/64] |= 1 << (off % 64) }
func (r *cidrRange) clear(off uint32)      { r.bitmap[off/64] &^= 1 << (off % 64) }
func (r *cidrRange) isSet(off uint32) bool { return r.bitmap[off/64]&(1<<(off%64)) != 0 }

// nextClear returns the first clear bit at or after off.
func (r *cidrRange) nextClear(off uint32) (uint32, bool) {
	for w := off / 64; w < uint32(len(r.bitmap)); w++ {
		word := r.bitmap[w]
		if w == off/64 {
			word |= 1<<(off%64) - 1 // ignore bits before off
		}
		if word != ^uint64(0) {
			return w*64 + uint32(bits.TrailingZeros64(^word)), true
		}
	}
	return 0, false
}

func addrFrom(v uint32) netip.Addr {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v)
	return netip.AddrFrom4(b)
}

// RouterIP returns the address reserved for the node's router: the first
// usable address of the first CIDR.
func (p *Pool) RouterIP() netip.Addr { return p.router }

// CIDRs returns the pool's CIDRs in the order given to New.
func (p *Pool) CIDRs() []netip.Prefix {
	out := make([]netip.Prefix, len(p.ranges))
	for i, r := range p.ranges {
		out[i] = r.prefix
	}
	return out
}

// Allocate hands out the next free address to owner (for pods
// "namespace/name", for the health endpoint "health").
//
// Possible errors: ErrEmptyOwner; ErrPoolExhausted, wrapped in a message
// that names the CIDRs and how many addresses they have.
func (p *Pool) Allocate(owner string) (netip.Addr, error) {
	if owner == "" {
		return netip.Addr{}, fmt.Errorf("allocate IP: %w", ErrEmptyOwner)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.used == p.usable {
		return netip.Addr{}, p.exhaustedError()
	}
	// Scan from the cursor to the end of its range, then the other ranges,
	// then the cursor's range again from its start.
	for n := 0; n <= len(p.ranges); n++ {
		ri := (p.nextRange + n) % len(p.ranges)
		r := p.ranges[ri]
		if r.free == 0 {
			continue
		}
		start := uint32(0)
		if n == 0 {
			start = p.nextOff
		}
		off, ok := r.nextClear(start)
		if !ok {
			continue
		}
		ip := p.take(r, off, owner)
		p.nextRange, p.nextOff = ri, off+1
		return ip, nil
	}
	// Unreachable while used and the bitmaps agree.
	return netip.Addr{}, p.exhaustedError()
}

func (p *Pool) take(r *cidrRange, off uint32, owner string) netip.Addr {
	r.set(off)
	r.free--
	p.used++
	ip := addrFrom(r.base + off)
	p.owners[ip] = owner
	return ip
}

func (p *Pool) exhaustedError() error {
	names := make([]string, len(p.ranges))
	for i, r := range p.ranges {
		names[i] = r.prefix.String()
	}
	return fmt.Errorf("%w: all %d usable addresses of %s are allocated, %s to the router; delete pods or give the node more pod CIDRs",
		ErrPoolExhausted, p.usable, strings.Join(names, ", "), p.router)
}

// locate returns the range holding ip and ip's offset in it. Its errors
// do not repeat ip: callers wrap them with it.
func (p *Pool) locate(ip netip.Addr) (*cidrRange, uint32, error) {
	ip = ip.Unmap()
	if !ip.Is4() {
		return nil, 0, fmt.Errorf("not an IPv4 address: %w", ErrNotInPool)
	}
	for _, r := range p.ranges {
		if !r.prefix.Contains(ip) {
			continue
		}
		off := binary.BigEndian.Uint32(ip.AsSlice()) - r.base
		switch off {
		case 0:
			return nil, 0, fmt.Errorf("network address of %v: %w", r.prefix, ErrNotInPool)
		case r.size - 1:
			return nil, 0, fmt.Errorf("broadcast address of %v: %w", r.prefix, ErrNotInPool)
		}
		return r, off, nil
	}
	return nil, 0, fmt.Errorf("outside %v: %w", p.CIDRs(), ErrNotInPool)
}

// AllocateIP allocates a given address to owner, to restore allocations
// after a restart. Allocating an address again to the owner that holds it
// succeeds and changes nothing.
//
// Possible errors: ErrEmptyOwner; ErrNotInPool (outside the CIDRs, network
// or broadcast address); ErrInUse, naming the current owner.
func (p *Pool) AllocateIP(ip netip.Addr, owner string) error {
	if owner == "" {
		return fmt.Errorf("allocate %v: %w", ip, ErrEmptyOwner)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	r, off, err := p.locate(ip)
	if err != nil {
		return fmt.Errorf("allocate %v: %w", ip, err)
	}
	ip = ip.Unmap()
	if r.isSet(off) {
		if cur := p.owners[ip]; cur != owner {
			return fmt.Errorf("allocate %v for %q: held by %q: %w", ip, owner, cur, ErrInUse)
		}
		return nil
	}
	p.take(r, off, owner)
	return nil
}

// Release frees an address. Releasing a free address is not an error.
//
// Possible errors: ErrNotInPool; ErrReserved for the router IP.
func (p *Pool) Release(ip netip.Addr) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, off, err := p.locate(ip)
	if err != nil {
		return fmt.Errorf("release %v: %w", ip, err)
	}
	ip = ip.Unmap()
	if ip == p.router {
		return fmt.Errorf("release %v: %w", ip, ErrReserved)
	}
	if !r.isSet(off) {
		return nil
	}
	r.clear(off)
	r.free++
	p.used--
	delete(p.owners, ip)
	return nil
}

// Owner returns the owner of an allocated address.
func (p *Pool) Owner(ip netip.Addr) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	owner, ok := p.owners[ip.Unmap()]
	return owner, ok
}

// Dump returns every allocated address with its owner, the router IP
// included (the content of a CiliumNode's status.ipam.used).
func (p *Pool) Dump() map[netip.Addr]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[netip.Addr]string, len(p.owners))
	for ip, owner := range p.owners {
		out[ip] = owner
	}
	return out
}

// Used returns how many addresses are allocated, the router IP included.
func (p *Pool) Used() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.used
}

// Capacity returns how many addresses the pool can hand out in total, the
// router IP included: the size of all CIDRs minus their network and
// broadcast addresses.
func (p *Pool) Capacity() int { return p.usable }
