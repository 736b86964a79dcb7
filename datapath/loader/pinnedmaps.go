package loader

import (
	"fmt"
	"sync"

	"github.com/cilium/ebpf"

	"github.com/cellium/cellium/datapath/bpf"
	"github.com/cellium/cellium/datapath/maps"
)

// PinnedMaps is Maps over datapath/maps: the global maps pinned in a
// directory (opened, or created, on first use) and the per-endpoint
// policy maps pinned beside them. It adapts datapath/maps to the small
// interface the loader needs.
type PinnedMaps struct {
	dir string

	mu     sync.Mutex
	global *maps.Maps
}

// NewPinnedMaps returns the maps pinned in dir (Layout.Dir). It does no
// I/O.
func NewPinnedMaps(dir string) *PinnedMaps { return &PinnedMaps{dir: dir} }

// Global implements Maps.
func (p *PinnedMaps) Global() (map[string]*ebpf.Map, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.global == nil {
		m, err := maps.Open(p.dir)
		if err != nil {
			return nil, err
		}
		p.global = m
	}
	m := p.global
	return map[string]*ebpf.Map{
		maps.IPCacheMapName:     m.IPCache.Map(),
		maps.EndpointsMapName:   m.Endpoints.Map(),
		maps.CT4MapName:         m.CT4.Map(),
		maps.MetricsMapName:     m.Metrics.Map(),
		maps.EventsMapName:      m.Events,
		maps.EventsLostMapName:  m.EventsLost.Map(),
		maps.PolicyProgsMapName: m.PolicyProgs.Map(),
		maps.FragMapName:        m.Frags,
		maps.IdentitiesMapName:  m.Identities.Map(),

		maps.SockXlateRefMapName: m.SockXlateRef,
	}, nil
}

// SetPolicyProgram implements PolicyPrograms: endpoint id's ingress policy
// program goes into the same-node redirect's slot of the endpoint.
func (p *PinnedMaps) SetPolicyProgram(id uint16, prog *ebpf.Program) error {
	if _, err := p.Global(); err != nil {
		return err
	}
	return p.global.PolicyProgs.Set(id, prog)
}

// DeletePolicyProgram implements PolicyPrograms: endpoint id's slot is
// emptied (packets to it take the stack and its to-container program).
func (p *PinnedMaps) DeletePolicyProgram(id uint16) error {
	if _, err := p.Global(); err != nil {
		return err
	}
	return p.global.PolicyProgs.Delete(id)
}

// Policy implements Maps.
func (p *PinnedMaps) Policy(id uint16) (*ebpf.Map, error) {
	pm, err := maps.OpenPolicyMap(p.dir, id)
	if err != nil {
		return nil, err
	}
	return pm.Map(), nil
}

// RemovePolicy implements Maps.
func (p *PinnedMaps) RemovePolicy(id uint16) error { return maps.RemovePolicyMap(p.dir, id) }

// Close closes the global maps if they were opened; the pins stay.
func (p *PinnedMaps) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.global == nil {
		return nil
	}
	err := p.global.Close()
	p.global = nil
	if err != nil {
		return fmt.Errorf("close global maps: %w", err)
	}
	return nil
}

// LoadSpec is the SpecLoader of the agent's programs: datapath/bpf's
// embedded object.
func LoadSpec() (*ebpf.CollectionSpec, error) { return bpf.LoadLxc() }
