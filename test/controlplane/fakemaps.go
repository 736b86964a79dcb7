package controlplane

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/cellium/cellium/daemon/bpfmaps"
	"github.com/cellium/cellium/daemon/socklb"
	"github.com/cellium/cellium/datapath/bpfconfig"
	dpmaps "github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/datapath/mapsync"
	"github.com/cellium/cellium/statedb/lb"
	"github.com/cellium/cellium/statedb/policy"
)

// Maps are the in-memory stand-ins of the agent's BPF maps, by the names
// the real maps are pinned under. Every write wakes those who wait for a
// change (Changed).
type Maps struct {
	mu      sync.Mutex
	changed chan struct{}

	ipcache  map[netip.Prefix]mapsync.IPCacheValue
	lxc      map[netip.Addr]mapsync.EndpointInfo
	policies map[uint16]map[policy.Key]mapsync.PolicyValue
	services map[dpmaps.ServiceSlot]dpmaps.ServiceValue
	backends map[uint32]lb.L4Addr
	match    map[dpmaps.AffinityMatch]struct{}
	ranges   map[dpmaps.SourceRange]struct{}
	// maglev holds the frontends' Maglev tables (--bpf-lb-algorithm=maglev).
	maglev map[lb.L4Addr][]uint32

	// Sockets are the host's listening sockets (host/sockets), which
	// OpenLB gives the host-port check.
	Sockets *HostSockets
}

// NewMaps returns empty maps.
func NewMaps() *Maps {
	return &Maps{
		changed:  make(chan struct{}),
		ipcache:  map[netip.Prefix]mapsync.IPCacheValue{},
		lxc:      map[netip.Addr]mapsync.EndpointInfo{},
		policies: map[uint16]map[policy.Key]mapsync.PolicyValue{},
		services: map[dpmaps.ServiceSlot]dpmaps.ServiceValue{},
		backends: map[uint32]lb.L4Addr{},
		match:    map[dpmaps.AffinityMatch]struct{}{},
		ranges:   map[dpmaps.SourceRange]struct{}{},
		maglev:   map[lb.L4Addr][]uint32{},
		Sockets:  newHostSockets(),
	}
}

// Changed returns a channel closed at the next write to any map.
func (m *Maps) Changed() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.changed
}

// write runs f under the lock and wakes the waiters.
func (m *Maps) write(f func()) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f()
	close(m.changed)
	m.changed = make(chan struct{})
}

func (m *Maps) read(f func()) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f()
}

// OpenBPF is the bpfmaps.Opener of the fakes.
func (m *Maps) OpenBPF(string) (bpfmaps.Targets, error) {
	return bpfmaps.Targets{
		IPCache:   fakeMap[netip.Prefix, mapsync.IPCacheValue]{m, func() map[netip.Prefix]mapsync.IPCacheValue { return m.ipcache }},
		Endpoints: fakeMap[netip.Addr, mapsync.EndpointInfo]{m, func() map[netip.Addr]mapsync.EndpointInfo { return m.lxc }},
		Policies:  fakePolicyMaps{m},
	}, nil
}

// OpenLB is the socklb.Opener of the fakes: no program is attached.
func (m *Maps) OpenLB(socklb.Config, bpfconfig.Config) (socklb.Targets, error) {
	return socklb.Targets{
		Services:      fakeServices{fakeMap[dpmaps.ServiceSlot, dpmaps.ServiceValue]{m, func() map[dpmaps.ServiceSlot]dpmaps.ServiceValue { return m.services }}},
		Backends:      fakeMap[uint32, lb.L4Addr]{m, func() map[uint32]lb.L4Addr { return m.backends }},
		AffinityMatch: fakeMatch{m},
		SourceRange:   fakeRanges{m},
		Maglev:        fakeMaglev{m},
		HostSockets:   m.Sockets,
	}, nil
}

// fakeMaglev is cellium_lb4_maglev: a frontend's table, replaced whole.
type fakeMaglev struct{ m *Maps }

func (f fakeMaglev) Swap(fe lb.L4Addr, table []uint32) error {
	f.m.write(func() { f.m.maglev[fe] = slices.Clone(table) })
	return nil
}

func (f fakeMaglev) Delete(fes []lb.L4Addr) error {
	f.m.write(func() {
		for _, fe := range fes {
			delete(f.m.maglev, fe)
		}
	})
	return nil
}

func (f fakeMaglev) Frontends() (out []lb.L4Addr, _ error) {
	f.m.read(func() { out = slices.Collect(maps.Keys(f.m.maglev)) })
	return out, nil
}

// fakeMap is one map of m; get returns its entries (called under m's lock).
type fakeMap[K, V comparable] struct {
	m   *Maps
	get func() map[K]V
}

func (f fakeMap[K, V]) Update(keys []K, vals []V) error {
	if len(keys) != len(vals) {
		return fmt.Errorf("update: %d keys but %d values", len(keys), len(vals))
	}
	f.m.write(func() {
		for i, k := range keys {
			f.get()[k] = vals[i]
		}
	})
	return nil
}

func (f fakeMap[K, V]) Delete(keys []K) error {
	f.m.write(func() {
		for _, k := range keys {
			delete(f.get(), k)
		}
	})
	return nil
}

func (f fakeMap[K, V]) Dump() (out map[K]V, _ error) {
	f.m.read(func() { out = maps.Clone(f.get()) })
	return out, nil
}

type fakeServices struct {
	fakeMap[dpmaps.ServiceSlot, dpmaps.ServiceValue]
}

func (f fakeServices) Lookup(k dpmaps.ServiceSlot) (v dpmaps.ServiceValue, ok bool, _ error) {
	f.m.read(func() { v, ok = f.m.services[k] })
	return v, ok, nil
}

type fakeMatch struct{ m *Maps }

func (f fakeMatch) Update(keys []dpmaps.AffinityMatch) error {
	f.m.write(func() {
		for _, k := range keys {
			f.m.match[k] = struct{}{}
		}
	})
	return nil
}

func (f fakeMatch) Delete(keys []dpmaps.AffinityMatch) error {
	f.m.write(func() {
		for _, k := range keys {
			delete(f.m.match, k)
		}
	})
	return nil
}

func (f fakeMatch) Dump() (out []dpmaps.AffinityMatch, _ error) {
	f.m.read(func() { out = slices.Collect(maps.Keys(f.m.match)) })
	return out, nil
}

type fakePolicyMaps struct{ m *Maps }

// maxPolicyEntries is the capacity of a fake policy map (the real one's).
const maxPolicyEntries = 16384

type fakePolicyMap struct {
	fakeMap[policy.Key, mapsync.PolicyValue]
}

func (fakePolicyMap) MaxEntries() int { return maxPolicyEntries }
func (fakePolicyMap) Close() error    { return nil }

func (f fakePolicyMaps) Open(id uint16) (mapsync.PolicyMap, error) {
	f.m.write(func() {
		if f.m.policies[id] == nil {
			f.m.policies[id] = map[policy.Key]mapsync.PolicyValue{}
		}
	})
	return fakePolicyMap{fakeMap[policy.Key, mapsync.PolicyValue]{f.m, func() map[policy.Key]mapsync.PolicyValue {
		if f.m.policies[id] == nil { // removed meanwhile: writes go nowhere
			return map[policy.Key]mapsync.PolicyValue{}
		}
		return f.m.policies[id]
	}}}, nil
}

func (f fakePolicyMaps) Remove(id uint16) error {
	f.m.write(func() { delete(f.m.policies, id) })
	return nil
}

func (f fakePolicyMaps) List() (ids []uint16, _ error) {
	f.m.read(func() { ids = slices.Sorted(maps.Keys(f.m.policies)) })
	return ids, nil
}

// Names of the maps as they are pinned.
const (
	IPCacheMap       = dpmaps.IPCacheMapName
	EndpointsMap     = dpmaps.EndpointsMapName
	ServicesMap      = dpmaps.LB4ServicesMapName
	BackendsMap      = dpmaps.LB4BackendsMapName
	AffinityMatchMap = dpmaps.LB4AffinityMatchMapName
	SourceRangeMap   = dpmaps.LB4SourceRangeMapName
	MaglevMap        = dpmaps.MaglevMapName
	// PolicyMapPrefix and the endpoint ID in five digits name an
	// endpoint's policy map (cellium_policy_00001).
	PolicyMapPrefix = dpmaps.PolicyMapName + "_"
)

// Names returns the names of the maps there are now, sorted.
func (m *Maps) Names() []string {
	names := []string{IPCacheMap, EndpointsMap, ServicesMap, BackendsMap, AffinityMatchMap, SourceRangeMap, MaglevMap}
	m.read(func() {
		for id := range m.policies {
			names = append(names, fmt.Sprintf("%s%05d", PolicyMapPrefix, id))
		}
	})
	slices.Sort(names)
	return names
}

// Dump renders map name as a table: a header line and one line per entry,
// sorted, columns separated by tabs. Empty values are "-".
func (m *Maps) Dump(name string) (header []string, rows [][]string, err error) {
	m.read(func() {
		switch name {
		case IPCacheMap:
			header = []string{"Prefix", "Identity", "TunnelEndpoint", "CIDRIdentity", "Flags"}
			for _, k := range slices.SortedFunc(maps.Keys(m.ipcache), comparePrefix) {
				v := m.ipcache[k]
				flags := "-"
				if v.ServiceFrontend {
					flags = "service"
				}
				rows = append(rows, []string{k.String(), u32(v.Identity), addr(v.TunnelEndpoint), u32(v.CIDRIdentity), flags})
			}
		case EndpointsMap:
			header = []string{"IP", "EndpointID", "Identity", "IfIndex", "MAC", "NodeMAC"}
			for _, k := range slices.SortedFunc(maps.Keys(m.lxc), netip.Addr.Compare) {
				v := m.lxc[k]
				rows = append(rows, []string{k.String(), strconv.Itoa(int(v.EndpointID)), u32(v.Identity), u32(v.IfIndex), mac(v.MAC), mac(v.NodeMAC)})
			}
		case ServicesMap:
			// Scope and Flags last: a file may leave them out (maps/cmp
			// compares the columns the file names).
			header = []string{"Frontend", "Slot", "BackendID", "Count", "Affinity", "Scope", "Flags"}
			for _, k := range slices.SortedFunc(maps.Keys(m.services), func(a, b dpmaps.ServiceSlot) int {
				return cmp.Or(compareL4(a.Frontend, b.Frontend), cmp.Compare(a.Scope, b.Scope), cmp.Compare(a.Slot, b.Slot))
			}) {
				v := m.services[k]
				aff, flags := "-", "-"
				if v.Affinity {
					aff = fmt.Sprintf("%ds", v.AffinityTimeout)
				}
				if k.Slot == 0 {
					flags = v.FlagString()
				}
				scope := "ext"
				if k.Scope == dpmaps.ScopeInt {
					scope = "int"
				}
				rows = append(rows, []string{l4(k.Frontend), strconv.Itoa(int(k.Slot)), u32(v.BackendID), strconv.Itoa(int(v.Count)), aff,
					scope, flags})
			}
		case BackendsMap:
			header = []string{"ID", "Address"}
			for _, k := range slices.Sorted(maps.Keys(m.backends)) {
				rows = append(rows, []string{u32(k), l4(m.backends[k])})
			}
		case MaglevMap:
			// A table as its size and the slots of each backend ID.
			header = []string{"Frontend", "Size", "SlotsPerBackend"}
			for _, k := range slices.SortedFunc(maps.Keys(m.maglev), compareL4) {
				per := map[uint32]int{}
				for _, id := range m.maglev[k] {
					per[id]++
				}
				var parts []string
				for _, id := range slices.Sorted(maps.Keys(per)) {
					parts = append(parts, fmt.Sprintf("%d:%d", id, per[id]))
				}
				rows = append(rows, []string{l4(k), strconv.Itoa(len(m.maglev[k])), strings.Join(parts, ",")})
			}
		case AffinityMatchMap:
			header = []string{"Frontend", "BackendID"}
			for _, k := range slices.SortedFunc(maps.Keys(m.match), func(a, b dpmaps.AffinityMatch) int {
				return cmp.Or(compareL4(a.Frontend, b.Frontend), cmp.Compare(a.BackendID, b.BackendID))
			}) {
				rows = append(rows, []string{l4(k.Frontend), u32(k.BackendID)})
			}
		case SourceRangeMap:
			header = []string{"Frontend", "Prefix"}
			for _, k := range slices.SortedFunc(maps.Keys(m.ranges), func(a, b dpmaps.SourceRange) int {
				return cmp.Or(compareL4(a.Frontend, b.Frontend), comparePrefix(a.Prefix, b.Prefix))
			}) {
				rows = append(rows, []string{l4(k.Frontend), k.Prefix.String()})
			}
		default:
			idStr, ok := strings.CutPrefix(name, PolicyMapPrefix)
			id, perr := strconv.ParseUint(idStr, 10, 16)
			if !ok || perr != nil {
				err = fmt.Errorf("no map %q: the maps are %s, and %s<endpoint ID in 5 digits> per endpoint", name,
					strings.Join([]string{IPCacheMap, EndpointsMap, ServicesMap, BackendsMap, AffinityMatchMap, SourceRangeMap, MaglevMap}, ", "), PolicyMapPrefix)
				return
			}
			pm, there := m.policies[uint16(id)]
			if !there {
				err = fmt.Errorf("no policy map for endpoint %d (there are: %v)", id, slices.Sorted(maps.Keys(m.policies)))
				return
			}
			header = []string{"Direction", "Identity", "Proto", "Port", "Verdict"}
			for _, k := range slices.SortedFunc(maps.Keys(pm), policy.Key.Compare) {
				verdict := "allow"
				if pm[k].Deny {
					verdict = "deny"
				}
				rows = append(rows, []string{k.Direction.String(), u32(uint32(k.Identity)), policy.ProtoName(k.Proto), port(k), verdict})
			}
		}
	})
	return header, rows, err
}

func comparePrefix(a, b netip.Prefix) int {
	return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
}

func compareL4(a, b lb.L4Addr) int {
	return cmp.Or(a.Addr.Compare(b.Addr), cmp.Compare(a.Port, b.Port), cmp.Compare(a.Proto, b.Proto))
}

func u32(v uint32) string { return strconv.FormatUint(uint64(v), 10) }

func addr(a netip.Addr) string {
	if !a.IsValid() {
		return "-"
	}
	return a.String()
}

func mac(m [6]byte) string {
	if m == [6]byte{} {
		return "-"
	}
	return fmt.Sprintf("%02x:%02x:%02x:%02x:%02x:%02x", m[0], m[1], m[2], m[3], m[4], m[5])
}

func l4(a lb.L4Addr) string {
	return fmt.Sprintf("%s:%d/%s", a.Addr, a.Port, lb.ProtoName(a.Proto))
}

// port renders a key's port prefix: "*" for every port, "80" for one, and
// "8080/13" for a range of ports sharing their top 13 bits.
func port(k policy.Key) string {
	switch k.PortPrefixLen {
	case 0:
		return "*"
	case 16:
		return strconv.Itoa(int(k.Port))
	}
	return fmt.Sprintf("%d/%d", k.Port, k.PortPrefixLen)
}

// fakeRanges is the fake cellium_lb4_source_range.
type fakeRanges struct{ m *Maps }

func (f fakeRanges) Update(keys []dpmaps.SourceRange) error {
	f.m.write(func() {
		for _, k := range keys {
			f.m.ranges[k] = struct{}{}
		}
	})
	return nil
}

func (f fakeRanges) Delete(keys []dpmaps.SourceRange) error {
	f.m.write(func() {
		for _, k := range keys {
			delete(f.m.ranges, k)
		}
	})
	return nil
}

func (f fakeRanges) Dump() (out []dpmaps.SourceRange, _ error) {
	f.m.read(func() { out = slices.Collect(maps.Keys(f.m.ranges)) })
	return out, nil
}
