package maps

import (
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"

	"github.com/cellium/cellium/datapath/bpf"
	"github.com/cellium/cellium/statedb/identity"
)

// ipcacheStaticPrefix is the part of an ipcache key's prefix length taken
// by pad1, pad2 and family, which are always matched.
const ipcacheStaticPrefix = 32

// IPCacheEntry is the value of an ipcache prefix.
type IPCacheEntry struct {
	// Identity is the security identity of the addresses in the prefix.
	Identity identity.NumericIdentity
	// TunnelEndpoint is the node to tunnel to; the zero Addr for none.
	// IPv4 only.
	TunnelEndpoint netip.Addr
	// Flags are IPCacheFlag* bits.
	Flags uint8
	// CIDRIdentity is the local-scope identity of the policy CIDR that
	// also holds the prefix (a pod's address an ipBlock names); 0: none.
	CIDRIdentity identity.NumericIdentity
}

// IPCacheFlagService marks a Service frontend address (a ClusterIP) the
// socket load balancer translates: cil_from_container drops a packet a
// pod sends to it untranslated with DropIsClusterIP (IPCACHE_F_SERVICE).
const IPCacheFlagService uint8 = 1 << 0

// cidrScope is the local scope of CIDR identities (1 << 24); the map
// keeps the 24 bits below it.
const cidrScope = identity.NumericIdentity(1 << 24)

// IPCache is cellium_ipcache: prefix -> identity. A lookup by the datapath
// finds the longest prefix holding an address; an address in no prefix is
// world (2).
type IPCache struct{ m *ebpf.Map }

// Map returns the underlying map.
func (c *IPCache) Map() *ebpf.Map { return c.m }

// IPCacheKey encodes p as the BPF key.
func IPCacheKey(p netip.Prefix) (bpf.LxcIpcacheKey, error) {
	if !p.IsValid() {
		return bpf.LxcIpcacheKey{}, fmt.Errorf("%w: prefix %v", ErrInvalidKey, p)
	}
	p = p.Masked()
	w, fam, err := addrWords(p.Addr())
	if err != nil {
		return bpf.LxcIpcacheKey{}, err
	}
	bitsLen := p.Bits()
	if p.Addr().Is4In6() {
		// An IPv4-mapped prefix counts as the IPv4 prefix it maps.
		bitsLen = max(bitsLen-96, 0)
	}
	return bpf.LxcIpcacheKey{Prefixlen: uint32(ipcacheStaticPrefix + bitsLen), Family: fam, Ip: w}, nil
}

// ipcachePrefix decodes a key.
func ipcachePrefix(k *bpf.LxcIpcacheKey) (netip.Prefix, error) {
	a, err := wordsAddr(k.Ip, k.Family)
	if err != nil {
		return netip.Prefix{}, err
	}
	if k.Prefixlen < ipcacheStaticPrefix || int(k.Prefixlen-ipcacheStaticPrefix) > a.BitLen() {
		return netip.Prefix{}, fmt.Errorf("%w: ipcache prefix length %d", ErrInvalidKey, k.Prefixlen)
	}
	return netip.PrefixFrom(a, int(k.Prefixlen-ipcacheStaticPrefix)), nil
}

func ipcacheValue(e IPCacheEntry) (bpf.LxcIpcacheValue, error) {
	v := bpf.LxcIpcacheValue{SecIdentity: uint32(e.Identity), Flags: e.Flags}
	if e.CIDRIdentity != 0 {
		if e.CIDRIdentity&^0xffffff != cidrScope {
			return v, fmt.Errorf("%w: CIDR identity %d is not of the local scope", ErrInvalidKey, e.CIDRIdentity)
		}
		low := uint32(e.CIDRIdentity) & 0xffffff
		v.CidrId = [3]uint8{uint8(low), uint8(low >> 8), uint8(low >> 16)}
	}
	if e.TunnelEndpoint.IsValid() {
		w, err := addrBE32(e.TunnelEndpoint)
		if err != nil {
			return v, fmt.Errorf("tunnel endpoint: %w", err)
		}
		v.TunnelEndpoint = w
	}
	return v, nil
}

func ipcacheEntry(v *bpf.LxcIpcacheValue) IPCacheEntry {
	e := IPCacheEntry{Identity: identity.NumericIdentity(v.SecIdentity), Flags: v.Flags}
	if low := uint32(v.CidrId[0]) | uint32(v.CidrId[1])<<8 | uint32(v.CidrId[2])<<16; low != 0 {
		e.CIDRIdentity = cidrScope | identity.NumericIdentity(low)
	}
	if v.TunnelEndpoint != 0 {
		e.TunnelEndpoint = be32Addr(v.TunnelEndpoint)
	}
	return e
}

// Update sets the entry of prefix p.
func (c *IPCache) Update(p netip.Prefix, e IPCacheEntry) error {
	k, err := IPCacheKey(p)
	if err != nil {
		return err
	}
	v, err := ipcacheValue(e)
	if err != nil {
		return err
	}
	if err := c.m.Update(&k, &v, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("update ipcache %v: %w", p, err)
	}
	return nil
}

// BatchUpdate sets many entries at once; prefixes and entries pair up by
// index.
func (c *IPCache) BatchUpdate(prefixes []netip.Prefix, entries []IPCacheEntry) error {
	if len(prefixes) != len(entries) {
		return fmt.Errorf("ipcache batch: %d prefixes but %d entries", len(prefixes), len(entries))
	}
	keys := make([]bpf.LxcIpcacheKey, len(prefixes))
	vals := make([]bpf.LxcIpcacheValue, len(prefixes))
	for i := range prefixes {
		var err error
		if keys[i], err = IPCacheKey(prefixes[i]); err != nil {
			return err
		}
		if vals[i], err = ipcacheValue(entries[i]); err != nil {
			return err
		}
	}
	return batchUpdate(c.m, keys, vals)
}

// Delete removes prefix p; a missing prefix is not an error.
func (c *IPCache) Delete(p netip.Prefix) error {
	k, err := IPCacheKey(p)
	if err != nil {
		return err
	}
	return deleteKey(c.m, &k)
}

// Lookup returns the entry of the longest prefix in the map that contains
// p, as the datapath sees it (an LPM trie lookup is not exact), or an error
// wrapping ebpf.ErrKeyNotExist when none does. Iterate for exact entries.
func (c *IPCache) Lookup(p netip.Prefix) (IPCacheEntry, error) {
	k, err := IPCacheKey(p)
	if err != nil {
		return IPCacheEntry{}, err
	}
	var v bpf.LxcIpcacheValue
	if err := c.m.Lookup(&k, &v); err != nil {
		return IPCacheEntry{}, fmt.Errorf("look up ipcache %v: %w", p, err)
	}
	return ipcacheEntry(&v), nil
}

// Iterate calls yield for every entry until it returns false. A key that
// does not decode ends the walk with an error.
func (c *IPCache) Iterate(yield func(netip.Prefix, IPCacheEntry) bool) error {
	var derr error
	err := iterate(c.m, func(k *bpf.LxcIpcacheKey, v *bpf.LxcIpcacheValue) bool {
		p, err := ipcachePrefix(k)
		if err != nil {
			derr = err
			return false
		}
		return yield(p, ipcacheEntry(v))
	})
	if err != nil {
		return err
	}
	return derr
}
