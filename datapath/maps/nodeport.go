package maps

import (
	"fmt"
	"maps"

	"github.com/cilium/ebpf"

	"github.com/cellium/cellium/datapath/bpf"
)

// LoadNodePortSpec returns the spec of the kube-proxy replacement's uplink
// program (bpf/nodeport.c) ready to load with NodePortReplacements.
func LoadNodePortSpec() (*ebpf.CollectionSpec, error) {
	spec, err := bpf.LoadNodeport()
	if err != nil {
		return nil, fmt.Errorf("load embedded nodeport object: %w", err)
	}
	// maps.h declares the policy template for the veth programs; the
	// uplink's never read it.
	delete(spec.Maps, PolicyMapName)
	return spec, nil
}

// NodePortReplacements returns the maps to load the uplink program with:
// the global maps and the load balancer's (lb, OpenLB).
func (m *Maps) NodePortReplacements(lb *LBMaps) map[string]*ebpf.Map {
	out := m.OverlayReplacements()
	out[SockXlateRefMapName] = m.SockXlateRef
	maps.Copy(out, lb.Replacements())
	return out
}

// NodePortNAT is one connection of cellium_nodeport_ct4 (the key as its
// packets arrive from the client, the entry their translation).
type NodePortNAT struct {
	Key   bpf.NodeportNodeportCt4Key
	Entry bpf.NodeportNodeportCt4Entry
}

// NodePortConnections returns the entries of cellium_nodeport_ct4,
// expired ones included (their expiry is in Entry.Expires, ktime ns).
func (m *Maps) NodePortConnections() ([]NodePortNAT, error) {
	var out []NodePortNAT
	err := iterate(m.NodePortCT4, func(k *bpf.NodeportNodeportCt4Key, v *bpf.NodeportNodeportCt4Entry) bool {
		out = append(out, NodePortNAT{Key: *k, Entry: *v})
		return true
	})
	if err != nil {
		return nil, fmt.Errorf("iterate %s: %w", NodePortCT4MapName, err)
	}
	return out, nil
}

// NodePortExpiry is one of the NodePort NAT maps seen by its entries'
// deadlines (ktime ns), for the agent's garbage collection
// (datapath/ctgc NewExpiring): the maps are plain hashes that evict
// nothing, so an expired entry stays until it is deleted.
type NodePortExpiry[K comparable, V any] struct {
	m       *ebpf.Map
	expires func(*V) uint64
}

// NodePortCT4Expiry is cellium_nodeport_ct4 by deadline.
func (m *Maps) NodePortCT4Expiry() NodePortExpiry[bpf.NodeportNodeportCt4Key, bpf.NodeportNodeportCt4Entry] {
	return NodePortExpiry[bpf.NodeportNodeportCt4Key, bpf.NodeportNodeportCt4Entry]{
		m: m.NodePortCT4, expires: func(e *bpf.NodeportNodeportCt4Entry) uint64 { return e.Expires }}
}

// NodePortRev4Expiry is cellium_nodeport_rev4 by deadline.
func (m *Maps) NodePortRev4Expiry() NodePortExpiry[bpf.NodeportNodeportRev4Key, bpf.NodeportNodeportRev4Entry] {
	return NodePortExpiry[bpf.NodeportNodeportRev4Key, bpf.NodeportNodeportRev4Entry]{
		m: m.NodePortRev4, expires: func(e *bpf.NodeportNodeportRev4Entry) uint64 { return e.Expires }}
}

// Iterate calls yield with every entry's key and deadline until it
// returns false.
func (t NodePortExpiry[K, V]) Iterate(yield func(K, uint64) bool) error {
	return iterate(t.m, func(k *K, v *V) bool { return yield(*k, t.expires(v)) })
}

// Expires returns k's deadline, or an error wrapping ebpf.ErrKeyNotExist.
func (t NodePortExpiry[K, V]) Expires(k K) (uint64, error) {
	var v V
	if err := t.m.Lookup(&k, &v); err != nil {
		return 0, fmt.Errorf("look up %s: %w", mapName(t.m), err)
	}
	return t.expires(&v), nil
}

// Delete removes k; a missing entry is not an error.
func (t NodePortExpiry[K, V]) Delete(k K) error { return deleteKey(t.m, &k) }

// Capacity is the map's size.
func (t NodePortExpiry[K, V]) Capacity() int { return int(t.m.MaxEntries()) }
