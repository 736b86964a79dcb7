package mapsync

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"

	"github.com/cellium/cellium/datapath/bpf"
	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/policy"
)

// IPCacheMap adapts the pinned cellium_ipcache map.
func IPCacheMap(m *maps.IPCache) Map[netip.Prefix, IPCacheValue] { return ipcacheMap{m} }

type ipcacheMap struct{ m *maps.IPCache }

func (c ipcacheMap) Update(keys []netip.Prefix, vals []IPCacheValue) error {
	entries := make([]maps.IPCacheEntry, len(vals))
	for i, v := range vals {
		entries[i] = maps.IPCacheEntry{Identity: identity.NumericIdentity(v.Identity), TunnelEndpoint: v.TunnelEndpoint,
			CIDRIdentity: identity.NumericIdentity(v.CIDRIdentity)}
		if v.ServiceFrontend {
			entries[i].Flags |= maps.IPCacheFlagService
		}
	}
	return c.m.BatchUpdate(keys, entries)
}

func (c ipcacheMap) Delete(keys []netip.Prefix) error {
	raw := make([]bpf.LxcIpcacheKey, len(keys))
	for i, k := range keys {
		var err error
		if raw[i], err = maps.IPCacheKey(k); err != nil {
			return err
		}
	}
	return deleteKeys(c.m.Map(), raw)
}

func (c ipcacheMap) Dump() (map[netip.Prefix]IPCacheValue, error) {
	out := map[netip.Prefix]IPCacheValue{}
	err := c.m.Iterate(func(p netip.Prefix, e maps.IPCacheEntry) bool {
		out[p] = IPCacheValue{Identity: e.Identity.Uint32(), TunnelEndpoint: e.TunnelEndpoint, CIDRIdentity: e.CIDRIdentity.Uint32(),
			ServiceFrontend: e.Flags&maps.IPCacheFlagService != 0}
		return true
	})
	return out, err
}

// EndpointsMap adapts the pinned cellium_lxc map.
func EndpointsMap(m *maps.Endpoints) Map[netip.Addr, EndpointInfo] { return endpointsMap{m} }

type endpointsMap struct{ m *maps.Endpoints }

func (e endpointsMap) Update(keys []netip.Addr, vals []EndpointInfo) error {
	infos := make([]maps.EndpointInfo, len(vals))
	for i, v := range vals {
		infos[i] = maps.EndpointInfo{IfIndex: v.IfIndex, ID: v.EndpointID, MAC: net.HardwareAddr(v.MAC[:]),
			NodeMAC: net.HardwareAddr(v.NodeMAC[:]), Identity: identity.NumericIdentity(v.Identity)}
	}
	return e.m.BatchUpdate(keys, infos)
}

func (e endpointsMap) Delete(keys []netip.Addr) error {
	raw := make([]bpf.LxcEndpointKey, len(keys))
	for i, k := range keys {
		var err error
		if raw[i], err = maps.EndpointKey(k); err != nil {
			return err
		}
	}
	return deleteKeys(e.m.Map(), raw)
}

func (e endpointsMap) Dump() (map[netip.Addr]EndpointInfo, error) {
	out := map[netip.Addr]EndpointInfo{}
	err := e.m.Iterate(func(a netip.Addr, info maps.EndpointInfo) bool {
		v := EndpointInfo{IfIndex: info.IfIndex, EndpointID: info.ID, Identity: info.Identity.Uint32()}
		copy(v.MAC[:], info.MAC)
		copy(v.NodeMAC[:], info.NodeMAC)
		out[a] = v
		return true
	})
	return out, err
}

// PinnedPolicyMaps are the per-endpoint policy maps pinned in Dir
// (cellium_policy_<id>, see datapath/maps).
type PinnedPolicyMaps struct{ Dir string }

var _ PolicyMaps = PinnedPolicyMaps{}

// Open implements PolicyMaps: the pinned map if there is one (a cheap
// open of the pin), else a new one created and pinned by datapath/maps.
func (p PinnedPolicyMaps) Open(id uint16) (PolicyMap, error) {
	m, err := ebpf.LoadPinnedMap(filepath.Join(p.Dir, maps.PolicyMapPinName(id)), nil)
	if errors.Is(err, os.ErrNotExist) {
		pm, err := maps.OpenPolicyMap(p.Dir, id)
		if err != nil {
			return nil, err
		}
		return policyMap{pm.Map()}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open pinned policy map of endpoint %d: %w", id, err)
	}
	return policyMap{m}, nil
}

// Remove implements PolicyMaps.
func (p PinnedPolicyMaps) Remove(id uint16) error { return maps.RemovePolicyMap(p.Dir, id) }

// List implements PolicyMaps.
func (p PinnedPolicyMaps) List() ([]uint16, error) {
	ents, err := os.ReadDir(p.Dir)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", p.Dir, err)
	}
	var ids []uint16
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), maps.PolicyMapPrefix)
		if !ok {
			continue
		}
		if n, err := strconv.ParseUint(rest, 10, 16); err == nil {
			ids = append(ids, uint16(n))
		}
	}
	return ids, nil
}

type policyMap struct{ m *ebpf.Map }

func (p policyMap) Close() error { return p.m.Close() }

func (p policyMap) MaxEntries() int { return int(p.m.MaxEntries()) }

func (p policyMap) Update(keys []policy.Key, vals []PolicyValue) error {
	raw := make([]bpf.LxcPolicyKey, len(keys))
	rv := make([]bpf.LxcPolicyEntry, len(vals))
	for i, k := range keys {
		raw[i] = maps.PolicyKey(k)
		rv[i] = bpf.LxcPolicyEntry{LpmPrefixLength: vals[i].LPMPrefixLen}
		if vals[i].Deny {
			rv[i].Deny = 1
		}
	}
	if len(raw) == 0 {
		return nil
	}
	if _, err := p.m.BatchUpdate(raw, rv, nil); err != nil {
		if !errors.Is(err, ebpf.ErrNotSupported) {
			return fmt.Errorf("batch update: %w", err)
		}
		for i := range raw {
			if err := p.m.Update(&raw[i], &rv[i], ebpf.UpdateAny); err != nil {
				return fmt.Errorf("update %s: %w", keys[i], err)
			}
		}
	}
	return nil
}

func (p policyMap) Delete(keys []policy.Key) error {
	raw := make([]bpf.LxcPolicyKey, len(keys))
	for i, k := range keys {
		raw[i] = maps.PolicyKey(k)
	}
	return deleteKeys(p.m, raw)
}

func (p policyMap) Dump() (map[policy.Key]PolicyValue, error) {
	out := map[policy.Key]PolicyValue{}
	var (
		k bpf.LxcPolicyKey
		v bpf.LxcPolicyEntry
	)
	it := p.m.Iterate()
	for it.Next(&k, &v) {
		key, err := maps.PolicyKeyFrom(k)
		if err != nil {
			return nil, err
		}
		out[key] = PolicyValue{Deny: v.Deny != 0, LPMPrefixLen: v.LpmPrefixLength}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("iterate: %w", err)
	}
	return out, nil
}

// deleteKeys deletes keys in one batch; when the batch stops at a key that
// is not there (or batches are not supported), the rest is deleted one by
// one, missing keys ignored.
func deleteKeys[K any](m *ebpf.Map, keys []K) error {
	if len(keys) == 0 {
		return nil
	}
	n, err := m.BatchDelete(keys, nil)
	if err == nil {
		return nil
	}
	if !errors.Is(err, ebpf.ErrKeyNotExist) && !errors.Is(err, ebpf.ErrNotSupported) {
		return fmt.Errorf("batch delete: %w", err)
	}
	for i := n; i < len(keys); i++ {
		if err := m.Delete(&keys[i]); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete: %w", err)
		}
	}
	return nil
}
