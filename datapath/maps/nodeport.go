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
