package maps

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/datapath/bpf"
	"github.com/cellium/cellium/statedb/lb"
)

// Names of the socket load balancer's maps (bpf/sock.c), also their pin
// names.
const (
	LB4ServicesMapName  = bpf.SockMapCelliumLb4Services  // frontend slots
	LB4BackendsMapName  = bpf.SockMapCelliumLb4Backends  // backend ID -> address
	LB4ReverseSKMapName = bpf.SockMapCelliumLb4ReverseSk // socket -> frontend
	// (client netns, frontend) -> backend, last used
	LB4AffinityMapName = bpf.SockMapCelliumLb4Affinity
	// (frontend, backend ID) pairs that exist
	LB4AffinityMatchMapName = bpf.SockMapCelliumLb4AffinityMatch
	// (frontend, client prefix) of loadBalancerSourceRanges
	LB4SourceRangeMapName = bpf.SockMapCelliumLb4SourceRange
)

var lbNames = []string{LB4ServicesMapName, LB4BackendsMapName, LB4ReverseSKMapName,
	LB4AffinityMapName, LB4AffinityMatchMapName, LB4SourceRangeMapName}

// lb4_service.flags (LB4_SVC_* of bpf/include/lb.h).
const (
	serviceFlagAffinity  = 0x1
	serviceFlagNodePort  = 0x2
	serviceFlagLocal     = 0x4
	serviceFlagTwoScopes = 0x8
	// LB4_SVC_SOURCE_RANGE
	serviceFlagSourceRange = 0x10
	// LB4_SVC_BANK1
	serviceFlagBank1 = 0x20
)

// Scopes of a frontend's entries (lb4_key.scope, LB4_SCOPE_*).
const (
	// ScopeExt is a frontend's only scope, or with TwoScopes the one
	// clients outside the cluster get.
	ScopeExt uint8 = 0
	// ScopeInt is the scope clients inside the cluster get when slot 0
	// of ScopeExt has TwoScopes.
	ScopeInt uint8 = 1
)

// ServiceSlot is a key of cellium_lb4_services: slot 0 of a frontend's
// scope holds its backend count, slots 1..count a backend ID each, in the
// bank slot 0 names (ServiceValue.Bank1).
type ServiceSlot struct {
	Frontend lb.L4Addr
	// Scope is ScopeExt (the zero value) or ScopeInt.
	Scope uint8
	Slot  uint16
	// Bank is 0 or 1: the slots of a new version of the backends go to
	// the bank not in use, slot 0 (always in bank 0) then switches.
	Bank uint8
}

// ServiceValue is a value of cellium_lb4_services.
type ServiceValue struct {
	// BackendID is the backend of a slot 1..count.
	BackendID uint32
	// Count is the number of backends (slot 0).
	Count uint16
	// Affinity is session affinity (sessionAffinity: ClientIP) with
	// AffinityTimeout seconds (slot 0; the C struct keeps the timeout
	// where the slots keep their backend ID).
	Affinity        bool
	AffinityTimeout uint32
	// NodePort, Local and TwoScopes are slot 0's LB4_SVC_NODEPORT (a
	// NodePort, LoadBalancer or externalIP frontend), LB4_SVC_LOCAL
	// (externalTrafficPolicy Local) and LB4_SVC_TWO_SCOPES (a ScopeInt
	// entry exists).
	NodePort  bool
	Local     bool
	TwoScopes bool
	// SourceRange is LB4_SVC_SOURCE_RANGE (slot 0 of ScopeExt): clients
	// from outside the node pass only when cellium_lb4_source_range holds
	// a prefix of their address for the frontend.
	SourceRange bool
	// Bank1 is LB4_SVC_BANK1 (slot 0): slots 1..Count are in bank 1.
	Bank1 bool
}

// FlagString is slot 0's flags as "nodeport,local,two-scopes" ("-" for
// none); session affinity is not among them.
func (v ServiceValue) FlagString() string {
	var fs []string
	if v.NodePort {
		fs = append(fs, "nodeport")
	}
	if v.Local {
		fs = append(fs, "local")
	}
	if v.TwoScopes {
		fs = append(fs, "two-scopes")
	}
	if v.SourceRange {
		fs = append(fs, "source-range")
	}
	if len(fs) == 0 {
		return "-"
	}
	return strings.Join(fs, ",")
}

func (v ServiceValue) bpf() bpf.SockLb4Service {
	out := bpf.SockLb4Service{BackendId: v.BackendID, Count: v.Count}
	if v.Affinity {
		out.Flags |= serviceFlagAffinity
	}
	if v.NodePort {
		out.Flags |= serviceFlagNodePort
	}
	if v.Local {
		out.Flags |= serviceFlagLocal
	}
	if v.TwoScopes {
		out.Flags |= serviceFlagTwoScopes
	}
	if v.SourceRange {
		out.Flags |= serviceFlagSourceRange
	}
	if v.Bank1 {
		out.Flags |= serviceFlagBank1
	}
	if v.AffinityTimeout != 0 {
		out.BackendId = v.AffinityTimeout
	}
	return out
}

// serviceValue decodes v of slot.
func serviceValue(slot uint16, v *bpf.SockLb4Service) ServiceValue {
	if slot != 0 {
		return ServiceValue{BackendID: v.BackendId}
	}
	out := ServiceValue{Count: v.Count, Affinity: v.Flags&serviceFlagAffinity != 0,
		NodePort: v.Flags&serviceFlagNodePort != 0, Local: v.Flags&serviceFlagLocal != 0,
		TwoScopes: v.Flags&serviceFlagTwoScopes != 0, SourceRange: v.Flags&serviceFlagSourceRange != 0,
		Bank1: v.Flags&serviceFlagBank1 != 0}
	if out.Affinity {
		out.AffinityTimeout = v.BackendId
	}
	return out
}

// LBMaps are the socket load balancer's maps, open. Close them when done;
// the pins stay.
type LBMaps struct {
	Services      *LB4Services
	Backends      *LB4Backends
	ReverseSK     *ebpf.Map
	Affinity      *LB4Affinity
	AffinityMatch *LB4AffinityMatch
	SourceRange   *LB4SourceRange
}

// DefaultLBMapMax is the capacity of the load balancer's service,
// backend and affinity maps without --bpf-lb-map-max (Cilium's default).
const DefaultLBMapMax = 65536

// MaxLBMapMax is the largest --bpf-lb-map-max accepted: a backend ID and a
// slot index fit the maps' keys up to it.
const MaxLBMapMax = 1 << 24

// LBOptions size the load balancer's maps.
type LBOptions struct {
	// MapMax is the capacity of cellium_lb4_services (one entry per
	// frontend scope and backend slot), cellium_lb4_backends and the
	// affinity maps (Cilium's --bpf-lb-map-max); 0 is DefaultLBMapMax.
	MapMax int
}

// lbSized are the maps LBOptions.MapMax sizes; their contents are the lb
// tables' (written again by the reconcilers) or soft state, so a pin of
// another size is replaced, not an error.
var lbSized = map[string]bool{LB4ServicesMapName: true, LB4BackendsMapName: true,
	LB4AffinityMapName: true, LB4AffinityMatchMapName: true}

// OpenLB opens the socket load balancer's maps pinned in dir with the
// default sizes (OpenLBWith).
func OpenLB(dir string) (*LBMaps, error) { return OpenLBWith(dir, LBOptions{}) }

// OpenLBWith opens the socket load balancer's maps pinned in dir (a bpffs
// directory), creating and pinning the missing ones, the sized ones with
// o.MapMax entries. A pinned sized map of another capacity or layout (the
// flag changed, or an upgrade) is replaced by a new, empty one: the
// reconcilers write every Service into it again, and programs loaded
// after this call use it. Any other pinned map of another layout is an
// error wrapping ebpf.ErrMapIncompatible. Callers in one agent (the
// socket programs' and the uplink program's loaders) must pass the same
// options; they are serialized by a lock on dir.
func OpenLBWith(dir string, o LBOptions) (*LBMaps, error) {
	size := o.MapMax
	if size == 0 {
		size = DefaultLBMapMax
	}
	if size < 0 || size > MaxLBMapMax {
		return nil, fmt.Errorf("load balancer map size %d: want 1 to %d", size, MaxLBMapMax)
	}
	spec, err := bpf.LoadSock()
	if err != nil {
		return nil, fmt.Errorf("load embedded socket LB object: %w", err)
	}
	unlock, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	defer unlock()
	opened := map[string]*ebpf.Map{}
	for _, name := range lbNames {
		ms, ok := spec.Maps[name]
		if !ok {
			closeMaps(opened)
			return nil, fmt.Errorf("embedded socket LB object has no map %s", name)
		}
		ms = ms.Copy()
		ms.Pinning = ebpf.PinByName
		if lbSized[name] {
			ms.MaxEntries = uint32(size)
		}
		m, err := ebpf.NewMapWithOptions(ms, ebpf.MapOptions{PinPath: dir})
		if errors.Is(err, ebpf.ErrMapIncompatible) && lbSized[name] {
			if rerr := os.Remove(filepath.Join(dir, name)); rerr != nil {
				err = errors.Join(err, rerr)
			} else {
				m, err = ebpf.NewMapWithOptions(ms, ebpf.MapOptions{PinPath: dir})
			}
		}
		if err != nil {
			closeMaps(opened)
			return nil, fmt.Errorf("open map %s in %s: %w", name, dir, err)
		}
		opened[name] = m
	}
	if err := linkReverseSK(dir, opened[LB4ReverseSKMapName]); err != nil {
		closeMaps(opened)
		return nil, err
	}
	return &LBMaps{Services: &LB4Services{m: opened[LB4ServicesMapName]},
		Backends: &LB4Backends{m: opened[LB4BackendsMapName]}, ReverseSK: opened[LB4ReverseSKMapName],
		Affinity: &LB4Affinity{m: opened[LB4AffinityMapName]}, AffinityMatch: &LB4AffinityMatch{m: opened[LB4AffinityMatchMapName]},
		SourceRange: &LB4SourceRange{m: opened[LB4SourceRangeMapName]}}, nil
}

func closeMaps(ms map[string]*ebpf.Map) {
	for _, m := range ms {
		m.Close()
	}
}

// Close closes the file descriptors; the pinned maps stay.
func (m *LBMaps) Close() error {
	return errors.Join(m.Services.m.Close(), m.Backends.m.Close(), m.ReverseSK.Close(),
		m.Affinity.m.Close(), m.AffinityMatch.m.Close(), m.SourceRange.m.Close())
}

// Replacements returns the maps to load the socket programs with
// (ebpf.CollectionOptions.MapReplacements).
func (m *LBMaps) Replacements() map[string]*ebpf.Map {
	return map[string]*ebpf.Map{
		LB4ServicesMapName:      m.Services.m,
		LB4BackendsMapName:      m.Backends.m,
		LB4ReverseSKMapName:     m.ReverseSK,
		LB4AffinityMapName:      m.Affinity.m,
		LB4AffinityMatchMapName: m.AffinityMatch.m,
		LB4SourceRangeMapName:   m.SourceRange.m,
	}
}

// linkReverseSK puts reverse, the socket load balancer's
// cellium_lb4_reverse_sk, into slot 0 of cellium_lb4_reverse_sk_ref in
// dir (creating and pinning it when the veth programs' loader has not
// yet), where the veth programs find it to name the Service of a
// connection (bpf/include/maps.h).
func linkReverseSK(dir string, reverse *ebpf.Map) error {
	ref, err := openSockXlateRef(dir)
	if err != nil {
		return err
	}
	defer ref.Close()
	if err := ref.Put(uint32(0), reverse); err != nil {
		return fmt.Errorf("put %s into %s: %w", LB4ReverseSKMapName, SockXlateRefMapName, err)
	}
	return nil
}

// openSockXlateRef opens cellium_lb4_reverse_sk_ref pinned in dir,
// creating it if it is missing or of another layout.
func openSockXlateRef(dir string) (*ebpf.Map, error) {
	specs, err := globalSpecs()
	if err != nil {
		return nil, err
	}
	ms := specs[SockXlateRefMapName]
	m, err := ebpf.NewMapWithOptions(ms, ebpf.MapOptions{PinPath: dir})
	if errors.Is(err, os.ErrExist) {
		m, err = ebpf.NewMapWithOptions(ms, ebpf.MapOptions{PinPath: dir})
	}
	if errors.Is(err, ebpf.ErrMapIncompatible) {
		if rerr := os.Remove(filepath.Join(dir, SockXlateRefMapName)); rerr == nil {
			m, err = ebpf.NewMapWithOptions(ms, ebpf.MapOptions{PinPath: dir})
		}
	}
	if err != nil {
		return nil, fmt.Errorf("open map %s in %s: %w", SockXlateRefMapName, dir, err)
	}
	return m, nil
}

// UnpinLB removes the pins of the socket load balancer's maps in dir and
// takes cellium_lb4_reverse_sk out of cellium_lb4_reverse_sk_ref; missing
// pins are not an error.
func UnpinLB(dir string) error {
	var errs []error
	if ref, err := ebpf.LoadPinnedMap(filepath.Join(dir, SockXlateRefMapName), nil); err == nil {
		if err := ref.Delete(uint32(0)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("empty %s: %w", SockXlateRefMapName, err))
		}
		ref.Close()
	} else if !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("open %s: %w", SockXlateRefMapName, err))
	}
	for _, name := range lbNames {
		if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("unpin %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// LB4Services is cellium_lb4_services.
type LB4Services struct{ m *ebpf.Map }

// Map returns the BPF map.
func (s *LB4Services) Map() *ebpf.Map { return s.m }

func lb4Key(k ServiceSlot) (bpf.SockLb4Key, error) {
	a, err := addrBE32(k.Frontend.Addr)
	if err != nil {
		return bpf.SockLb4Key{}, err
	}
	return bpf.SockLb4Key{Address: a, Dport: htons(k.Frontend.Port), Proto: k.Frontend.Proto, Scope: k.Scope, Slot: k.Slot,
		Bank: uint16(k.Bank)}, nil
}

func lb4Slot(k *bpf.SockLb4Key) ServiceSlot {
	return ServiceSlot{Frontend: lb.L4Addr{Addr: be32Addr(k.Address), Port: ntohs(k.Dport), Proto: k.Proto}, Scope: k.Scope, Slot: k.Slot,
		Bank: uint8(k.Bank)}
}

// Update writes the pairs keys[i] -> vals[i] in one batch where the
// kernel allows.
func (s *LB4Services) Update(keys []ServiceSlot, vals []ServiceValue) error {
	if len(keys) != len(vals) {
		return fmt.Errorf("services batch: %d keys but %d values", len(keys), len(vals))
	}
	ks := make([]bpf.SockLb4Key, len(keys))
	vs := make([]bpf.SockLb4Service, len(keys))
	for i := range keys {
		var err error
		if ks[i], err = lb4Key(keys[i]); err != nil {
			return err
		}
		vs[i] = vals[i].bpf()
	}
	return batchUpdate(s.m, ks, vs)
}

// Delete removes keys; missing keys are not an error.
func (s *LB4Services) Delete(keys []ServiceSlot) error {
	for _, k := range keys {
		bk, err := lb4Key(k)
		if err != nil {
			return err
		}
		if err := deleteKey(s.m, &bk); err != nil {
			return err
		}
	}
	return nil
}

// Lookup returns the value of k, or an error wrapping
// ebpf.ErrKeyNotExist.
func (s *LB4Services) Lookup(k ServiceSlot) (ServiceValue, error) {
	bk, err := lb4Key(k)
	if err != nil {
		return ServiceValue{}, err
	}
	var v bpf.SockLb4Service
	if err := s.m.Lookup(&bk, &v); err != nil {
		return ServiceValue{}, fmt.Errorf("look up %v slot %d: %w", k.Frontend, k.Slot, err)
	}
	return serviceValue(k.Slot, &v), nil
}

// Iterate calls yield for every entry until it returns false.
func (s *LB4Services) Iterate(yield func(ServiceSlot, ServiceValue) bool) error {
	return iterate(s.m, func(k *bpf.SockLb4Key, v *bpf.SockLb4Service) bool {
		return yield(lb4Slot(k), serviceValue(k.Slot, v))
	})
}

// LB4Backends is cellium_lb4_backends.
type LB4Backends struct{ m *ebpf.Map }

// Map returns the BPF map.
func (s *LB4Backends) Map() *ebpf.Map { return s.m }

// Update writes ids[i] -> addrs[i].
func (b *LB4Backends) Update(ids []uint32, addrs []lb.L4Addr) error {
	if len(ids) != len(addrs) {
		return fmt.Errorf("backends batch: %d IDs but %d addresses", len(ids), len(addrs))
	}
	vs := make([]bpf.SockLb4Backend, len(ids))
	for i, a := range addrs {
		w, err := addrBE32(a.Addr)
		if err != nil {
			return err
		}
		vs[i] = bpf.SockLb4Backend{Address: w, Port: htons(a.Port), Proto: a.Proto}
	}
	return batchUpdate(b.m, ids, vs)
}

// Delete removes ids; missing IDs are not an error.
func (b *LB4Backends) Delete(ids []uint32) error {
	for _, id := range ids {
		if err := deleteKey(b.m, &id); err != nil {
			return err
		}
	}
	return nil
}

// Iterate calls yield for every entry until it returns false.
func (b *LB4Backends) Iterate(yield func(uint32, lb.L4Addr) bool) error {
	return iterate(b.m, func(k *uint32, v *bpf.SockLb4Backend) bool {
		return yield(*k, lb.L4Addr{Addr: be32Addr(v.Address), Port: ntohs(v.Port), Proto: v.Proto})
	})
}

// AffinityMatch is a key of cellium_lb4_affinity_match: backend BackendID
// is one of Frontend's.
type AffinityMatch struct {
	Frontend  lb.L4Addr
	BackendID uint32
}

func (a AffinityMatch) bpf() (bpf.SockLb4AffinityMatchKey, error) {
	w, err := addrBE32(a.Frontend.Addr)
	if err != nil {
		return bpf.SockLb4AffinityMatchKey{}, err
	}
	return bpf.SockLb4AffinityMatchKey{Address: w, Dport: htons(a.Frontend.Port), Proto: a.Frontend.Proto, BackendId: a.BackendID}, nil
}

// LB4AffinityMatch is cellium_lb4_affinity_match.
type LB4AffinityMatch struct{ m *ebpf.Map }

// Map returns the BPF map.
func (s *LB4AffinityMatch) Map() *ebpf.Map { return s.m }

// Update adds keys.
func (a *LB4AffinityMatch) Update(keys []AffinityMatch) error {
	ks := make([]bpf.SockLb4AffinityMatchKey, len(keys))
	for i, k := range keys {
		var err error
		if ks[i], err = k.bpf(); err != nil {
			return err
		}
	}
	return batchUpdate(a.m, ks, make([]uint8, len(keys)))
}

// Delete removes keys; missing keys are not an error.
func (a *LB4AffinityMatch) Delete(keys []AffinityMatch) error {
	for _, k := range keys {
		bk, err := k.bpf()
		if err != nil {
			return err
		}
		if err := deleteKey(a.m, &bk); err != nil {
			return err
		}
	}
	return nil
}

// Iterate calls yield for every entry until it returns false.
func (a *LB4AffinityMatch) Iterate(yield func(AffinityMatch) bool) error {
	return iterate(a.m, func(k *bpf.SockLb4AffinityMatchKey, _ *uint8) bool {
		return yield(AffinityMatch{Frontend: lb.L4Addr{Addr: be32Addr(k.Address), Port: ntohs(k.Dport), Proto: k.Proto}, BackendID: k.BackendId})
	})
}

// AffinityKey is a key of cellium_lb4_affinity: a client (the cookie of
// its network namespace) and a frontend.
type AffinityKey struct {
	NetnsCookie uint64
	Frontend    lb.L4Addr
}

// AffinityValue is a value of cellium_lb4_affinity.
type AffinityValue struct {
	BackendID uint32
	// LastUsed is when the programs last sent the client to the backend,
	// in bpf_ktime_get_ns (CLOCK_MONOTONIC) nanoseconds.
	LastUsed uint64
}

// LB4Affinity is cellium_lb4_affinity, written by the programs.
type LB4Affinity struct{ m *ebpf.Map }

// Map returns the BPF map.
func (s *LB4Affinity) Map() *ebpf.Map { return s.m }

func (a *LB4Affinity) key(k AffinityKey) (bpf.SockLb4AffinityKey, error) {
	w, err := addrBE32(k.Frontend.Addr)
	if err != nil {
		return bpf.SockLb4AffinityKey{}, err
	}
	return bpf.SockLb4AffinityKey{NetnsCookie: k.NetnsCookie, Address: w, Dport: htons(k.Frontend.Port), Proto: k.Frontend.Proto}, nil
}

// Update writes k -> v (tests age entries with it).
func (a *LB4Affinity) Update(k AffinityKey, v AffinityValue) error {
	bk, err := a.key(k)
	if err != nil {
		return err
	}
	if err := a.m.Put(&bk, &bpf.SockLb4AffinityValue{BackendId: v.BackendID, LastUsed: v.LastUsed}); err != nil {
		return fmt.Errorf("update %s: %w", LB4AffinityMapName, err)
	}
	return nil
}

// Iterate calls yield for every entry until it returns false.
func (a *LB4Affinity) Iterate(yield func(AffinityKey, AffinityValue) bool) error {
	return iterate(a.m, func(k *bpf.SockLb4AffinityKey, v *bpf.SockLb4AffinityValue) bool {
		return yield(AffinityKey{NetnsCookie: k.NetnsCookie, Frontend: lb.L4Addr{Addr: be32Addr(k.Address), Port: ntohs(k.Dport), Proto: k.Proto}},
			AffinityValue{BackendID: v.BackendId, LastUsed: v.LastUsed})
	})
}

// SourceRange is a key of cellium_lb4_source_range: clients in Prefix
// may use Frontend (loadBalancerSourceRanges).
type SourceRange struct {
	Frontend lb.L4Addr
	Prefix   netip.Prefix
}

// srcRangeStaticPrefix is LB4_SRC_RANGE_STATIC_PREFIX: the bits of the
// frontend's address, port, protocol and padding.
const srcRangeStaticPrefix = 64

func (r SourceRange) bpf() (bpf.SockLb4SrcRangeKey, error) {
	fe, err := addrBE32(r.Frontend.Addr)
	if err != nil {
		return bpf.SockLb4SrcRangeKey{}, err
	}
	if !r.Prefix.Addr().Is4() {
		return bpf.SockLb4SrcRangeKey{}, fmt.Errorf("source range %v: not an IPv4 prefix", r.Prefix)
	}
	src, err := addrBE32(r.Prefix.Masked().Addr())
	if err != nil {
		return bpf.SockLb4SrcRangeKey{}, err
	}
	return bpf.SockLb4SrcRangeKey{Prefixlen: srcRangeStaticPrefix + uint32(r.Prefix.Bits()), Address: fe,
		Dport: htons(r.Frontend.Port), Proto: r.Frontend.Proto, Saddr: src}, nil
}

// LB4SourceRange is cellium_lb4_source_range.
type LB4SourceRange struct{ m *ebpf.Map }

// Update adds keys.
func (s *LB4SourceRange) Update(keys []SourceRange) error {
	ks := make([]bpf.SockLb4SrcRangeKey, len(keys))
	for i, k := range keys {
		var err error
		if ks[i], err = k.bpf(); err != nil {
			return err
		}
	}
	return batchUpdate(s.m, ks, make([]uint8, len(keys)))
}

// Delete removes keys; missing keys are not an error.
func (s *LB4SourceRange) Delete(keys []SourceRange) error {
	for _, k := range keys {
		bk, err := k.bpf()
		if err != nil {
			return err
		}
		if err := deleteKey(s.m, &bk); err != nil {
			return err
		}
	}
	return nil
}

// Iterate calls yield for every entry until it returns false.
func (s *LB4SourceRange) Iterate(yield func(SourceRange) bool) error {
	return iterate(s.m, func(k *bpf.SockLb4SrcRangeKey, _ *uint8) bool {
		bits := int(k.Prefixlen) - srcRangeStaticPrefix
		return yield(SourceRange{Frontend: lb.L4Addr{Addr: be32Addr(k.Address), Port: ntohs(k.Dport), Proto: k.Proto},
			Prefix: netip.PrefixFrom(be32Addr(k.Saddr), bits)})
	})
}

// FitReplacements gives each map of spec that repl replaces the
// replacement's capacity: the load balancer's maps are sized by a flag
// (--bpf-lb-map-max, OpenLBWith) and a program is loaded against them as
// they are (cilium/ebpf refuses a replacement of another size).
func FitReplacements(spec *ebpf.CollectionSpec, repl map[string]*ebpf.Map) {
	for name, m := range repl {
		if ms, ok := spec.Maps[name]; ok && m != nil {
			ms.MaxEntries = m.MaxEntries()
		}
	}
}

// lockDir takes an exclusive flock on directory dir (bpffs has no regular
// files to lock) until the returned function runs.
func lockDir(dir string) (func(), error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("open %s to lock it: %w", dir, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	return func() {
		_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
		f.Close()
	}, nil
}
