package maps

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"

	"github.com/cellium/cellium/datapath/bpf"
)

// Names of the maps, which are also their pin names under the bpffs
// directory.
const (
	IPCacheMapName   = bpf.LxcMapCelliumIpcache // prefix -> identity
	EndpointsMapName = bpf.LxcMapCelliumLxc     // local endpoints
	CT4MapName       = bpf.LxcMapCelliumCt4     // IPv4 conntrack
	MetricsMapName   = bpf.LxcMapCelliumMetrics // per-reason counters
	EventsMapName    = bpf.LxcMapCelliumEvents  // ring buffer of events
	// EventsLostMapName counts, per CPU, the events that did not fit
	// into the ring buffer.
	EventsLostMapName = bpf.LxcMapCelliumEventsLost
	// PolicyProgsMapName is the prog array of the endpoints'
	// cil_lxc_policy programs, by endpoint ID (same-node redirect).
	PolicyProgsMapName = bpf.LxcMapCelliumPolicyProgs
	// FragMapName holds the ports of fragmented datagrams, from their
	// first fragment, for the fragments after it.
	FragMapName = bpf.LxcMapCelliumIpv4FragDatagrams
	// IdentitiesMapName is the set of the cluster's security identities,
	// against which the tunnel programs check a packet's VNI.
	IdentitiesMapName = bpf.LxcMapCelliumIdentities
	// PolicyMapName is the template map of the programs that the loader
	// replaces with an endpoint's own policy map.
	PolicyMapName = bpf.LxcMapCelliumPolicy
	// SockXlateRefMapName holds, in slot 0, the socket load balancer's
	// cellium_lb4_reverse_sk while it is on (OpenLB, UnpinLB): the veth
	// programs read the ClusterIP a socket asked for from it.
	SockXlateRefMapName = bpf.LxcMapCelliumLb4ReverseSkRef
	// NodePortCT4MapName holds the connections from outside the node to
	// NodePort, LoadBalancer and externalIP frontends (bpf/nodeport.c),
	// keyed as they arrive, with their translation.
	NodePortCT4MapName = bpf.LxcMapCelliumNodeportCt4
	// NodePortRev4MapName holds the same connections keyed by their
	// replies, for the reverse translation.
	NodePortRev4MapName = bpf.LxcMapCelliumNodeportRev4
	// NodePortAffinity4MapName holds the backend of an outside client
	// for a frontend with session affinity.
	NodePortAffinity4MapName = bpf.LxcMapCelliumNodeportAffinity4
)

// Maps are the global maps, open. Close them when done; the pins stay.
type Maps struct {
	IPCache   *IPCache
	Endpoints *Endpoints
	CT4       *CT4
	Metrics   *Metrics
	// Events is the ring buffer; read it with NewEventReader.
	Events *ebpf.Map
	// EventsLost counts the events the ring buffer had no room for.
	EventsLost *EventsLost
	// PolicyProgs holds each endpoint's cil_lxc_policy program.
	PolicyProgs *PolicyProgs
	// Frags is the fragment tracking map (soft state of the programs).
	Frags *ebpf.Map
	// Identities is the set of known security identities (tunnel VNIs).
	Identities *Identities
	// SockXlateRef is cellium_lb4_reverse_sk_ref (SockXlateRefMapName).
	SockXlateRef *ebpf.Map
	// NodePortCT4, NodePortRev4 and NodePortAffinity4 are the NAT state of
	// the kube-proxy replacement (soft state of the programs).
	NodePortCT4, NodePortRev4, NodePortAffinity4 *ebpf.Map
}

// globalNames are the global maps, pinned by name.
var globalNames = []string{IPCacheMapName, EndpointsMapName, CT4MapName, MetricsMapName, EventsMapName, EventsLostMapName, PolicyProgsMapName, FragMapName, IdentitiesMapName, SockXlateRefMapName,
	NodePortCT4MapName, NodePortRev4MapName, NodePortAffinity4MapName}

// softState are the global maps whose contents the programs rebuild from
// traffic: a pin of another layout (an upgrade changed it) is replaced by
// a new map instead of failing, at the cost of its entries.
var softState = map[string]bool{CT4MapName: true, FragMapName: true, SockXlateRefMapName: true,
	NodePortCT4MapName: true, NodePortRev4MapName: true, NodePortAffinity4MapName: true}

// globalSpecs returns the specs of the global maps, pinned by name.
func globalSpecs() (map[string]*ebpf.MapSpec, error) {
	spec, err := bpf.LoadLxc()
	if err != nil {
		return nil, fmt.Errorf("load embedded BPF object: %w", err)
	}
	out := map[string]*ebpf.MapSpec{}
	for _, name := range globalNames {
		ms, ok := spec.Maps[name]
		if !ok {
			return nil, fmt.Errorf("embedded BPF object has no map %s", name)
		}
		ms = ms.Copy()
		ms.Pinning = ebpf.PinByName
		out[name] = ms
	}
	return out, nil
}

// Open opens the global maps pinned in dir, creating and pinning the ones
// that are missing. dir must be on a bpffs (EnsureBPFFS). A pinned map whose
// type, key, value or size differ from this build's is an error wrapping
// ebpf.ErrMapIncompatible: remove the pin (the datapath loses that map's
// state) or run the matching agent version; the conntrack and fragment
// maps are the exception, replaced by new ones (their connections then
// start over, as after a conntrack flush).
func Open(dir string) (*Maps, error) {
	specs, err := globalSpecs()
	if err != nil {
		return nil, err
	}
	opened := map[string]*ebpf.Map{}
	closeAll := func() {
		for _, m := range opened {
			m.Close()
		}
	}
	for name, ms := range specs {
		m, err := ebpf.NewMapWithOptions(ms, ebpf.MapOptions{PinPath: dir})
		if errors.Is(err, os.ErrExist) {
			// Another process (or cell: the datapath monitor opens the
			// maps once the events map is pinned) pinned it between our
			// look-up and our pin: open theirs.
			m, err = ebpf.NewMapWithOptions(ms, ebpf.MapOptions{PinPath: dir})
		}
		if errors.Is(err, ebpf.ErrMapIncompatible) && softState[name] {
			if rerr := os.Remove(filepath.Join(dir, name)); rerr != nil {
				err = errors.Join(err, rerr)
			} else {
				m, err = ebpf.NewMapWithOptions(ms, ebpf.MapOptions{PinPath: dir})
			}
		}
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("open map %s in %s: %w", name, dir, err)
		}
		opened[name] = m
	}
	return &Maps{
		IPCache:     &IPCache{m: opened[IPCacheMapName]},
		Endpoints:   &Endpoints{m: opened[EndpointsMapName]},
		CT4:         &CT4{m: opened[CT4MapName]},
		Metrics:     &Metrics{m: opened[MetricsMapName]},
		Events:      opened[EventsMapName],
		EventsLost:  &EventsLost{m: opened[EventsLostMapName]},
		PolicyProgs: &PolicyProgs{m: opened[PolicyProgsMapName]},
		Frags:       opened[FragMapName],
		Identities:  &Identities{m: opened[IdentitiesMapName]},

		SockXlateRef: opened[SockXlateRefMapName],

		NodePortCT4:       opened[NodePortCT4MapName],
		NodePortRev4:      opened[NodePortRev4MapName],
		NodePortAffinity4: opened[NodePortAffinity4MapName],
	}, nil
}

// Close closes the file descriptors; the pinned maps stay.
func (m *Maps) Close() error {
	return errors.Join(m.IPCache.m.Close(), m.Endpoints.m.Close(), m.CT4.m.Close(),
		m.Metrics.m.Close(), m.Events.Close(), m.EventsLost.m.Close(), m.PolicyProgs.m.Close(), m.Frags.Close(), m.Identities.m.Close(),
		m.SockXlateRef.Close(), m.NodePortCT4.Close(), m.NodePortRev4.Close(), m.NodePortAffinity4.Close())
}

// Replacements returns the maps to load an endpoint's programs with
// (ebpf.CollectionOptions.MapReplacements): the global maps and the
// endpoint's own policy map in place of the template.
func (m *Maps) Replacements(policy *PolicyMap) map[string]*ebpf.Map {
	return map[string]*ebpf.Map{
		IPCacheMapName:     m.IPCache.m,
		EndpointsMapName:   m.Endpoints.m,
		CT4MapName:         m.CT4.m,
		MetricsMapName:     m.Metrics.m,
		EventsMapName:      m.Events,
		EventsLostMapName:  m.EventsLost.m,
		PolicyProgsMapName: m.PolicyProgs.m,
		FragMapName:        m.Frags,
		IdentitiesMapName:  m.Identities.m,
		PolicyMapName:      policy.m,

		SockXlateRefMapName: m.SockXlateRef,

		NodePortCT4MapName:       m.NodePortCT4,
		NodePortRev4MapName:      m.NodePortRev4,
		NodePortAffinity4MapName: m.NodePortAffinity4,
	}
}

// OverlayReplacements returns the maps to load the tunnel device's
// programs (bpf.LoadOverlay) with: the global maps. The spec's policy map
// template, which those programs never use, must be removed from the spec
// before loading (LoadOverlaySpec does both).
func (m *Maps) OverlayReplacements() map[string]*ebpf.Map {
	return map[string]*ebpf.Map{
		IPCacheMapName:     m.IPCache.m,
		EndpointsMapName:   m.Endpoints.m,
		CT4MapName:         m.CT4.m,
		MetricsMapName:     m.Metrics.m,
		EventsMapName:      m.Events,
		EventsLostMapName:  m.EventsLost.m,
		PolicyProgsMapName: m.PolicyProgs.m,
		FragMapName:        m.Frags,
		IdentitiesMapName:  m.Identities.m,

		NodePortCT4MapName:       m.NodePortCT4,
		NodePortRev4MapName:      m.NodePortRev4,
		NodePortAffinity4MapName: m.NodePortAffinity4,
	}
}

// LoadOverlaySpec returns the spec of the tunnel device's programs ready to
// load with OverlayReplacements.
func LoadOverlaySpec() (*ebpf.CollectionSpec, error) {
	spec, err := bpf.LoadOverlay()
	if err != nil {
		return nil, fmt.Errorf("load embedded overlay object: %w", err)
	}
	delete(spec.Maps, PolicyMapName)
	// maps.h declares it for the veth programs; the overlay's never read it.
	delete(spec.Maps, SockXlateRefMapName)
	return spec, nil
}

// NewEventReader returns a reader of the event ring buffer; decode its
// records with DecodeEvent. Close it to stop a blocked Read.
func (m *Maps) NewEventReader() (*ringbuf.Reader, error) {
	r, err := ringbuf.NewReader(m.Events)
	if err != nil {
		return nil, fmt.Errorf("open event ring buffer: %w", err)
	}
	return r, nil
}

// Unpin removes the pins of the global maps in dir (not the policy maps);
// missing pins are not an error. Programs that use the maps keep them.
func Unpin(dir string) error {
	var errs []error
	for _, name := range globalNames {
		if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("unpin %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// iterate walks m with typed keys and values until yield returns false.
func iterate[K, V any](m *ebpf.Map, yield func(*K, *V) bool) error {
	var k K
	var v V
	it := m.Iterate()
	for it.Next(&k, &v) {
		if !yield(&k, &v) {
			return nil
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("iterate %s: %w", mapName(m), err)
	}
	return nil
}

// deleteKey deletes key from m; a missing key is not an error.
func deleteKey(m *ebpf.Map, key any) error {
	if err := m.Delete(key); err != nil && !isNotExist(err) {
		return fmt.Errorf("delete from %s: %w", mapName(m), err)
	}
	return nil
}

// batchUpdate writes keys and values with one batch operation where the
// kernel supports it for the map type, else one by one.
func batchUpdate[K, V any](m *ebpf.Map, keys []K, vals []V) error {
	if len(keys) == 0 {
		return nil
	}
	_, err := m.BatchUpdate(keys, vals, nil)
	if err == nil {
		return nil
	}
	if !errors.Is(err, ebpf.ErrNotSupported) {
		return fmt.Errorf("batch update %s: %w", mapName(m), err)
	}
	for i := range keys {
		if err := m.Update(&keys[i], &vals[i], ebpf.UpdateAny); err != nil {
			return fmt.Errorf("update %s: %w", mapName(m), err)
		}
	}
	return nil
}

func isNotExist(err error) bool { return errors.Is(err, ebpf.ErrKeyNotExist) }

func mapName(m *ebpf.Map) string {
	if info, err := m.Info(); err == nil && info.Name != "" {
		return info.Name
	}
	return m.String()
}
