package maps

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"

	"github.com/cellium/cellium/datapath/bpf"
	"github.com/cellium/cellium/statedb/lb"
)

// Names of the socket load balancer's maps (bpf/sock.c), also their pin
// names.
const (
	LB4ServicesMapName  = bpf.SockMapCelliumLb4Services  // frontend slots
	LB4BackendsMapName  = bpf.SockMapCelliumLb4Backends  // backend ID -> address
	LB4ReverseSKMapName = bpf.SockMapCelliumLb4ReverseSk // socket -> frontend
)

var lbNames = []string{LB4ServicesMapName, LB4BackendsMapName, LB4ReverseSKMapName}

// ServiceSlot is a key of cellium_lb4_services: slot 0 of a frontend
// holds its backend count, slots 1..count a backend ID each.
type ServiceSlot struct {
	Frontend lb.L4Addr
	Slot     uint16
}

// ServiceValue is a value of cellium_lb4_services.
type ServiceValue struct {
	// BackendID is the backend of a slot 1..count.
	BackendID uint32
	// Count is the number of backends (slot 0).
	Count uint16
}

// LBMaps are the socket load balancer's maps, open. Close them when done;
// the pins stay.
type LBMaps struct {
	Services  *LB4Services
	Backends  *LB4Backends
	ReverseSK *ebpf.Map
}

// OpenLB opens the socket load balancer's maps pinned in dir (a bpffs
// directory), creating and pinning the missing ones. A pinned map of
// another layout is an error wrapping ebpf.ErrMapIncompatible.
func OpenLB(dir string) (*LBMaps, error) {
	spec, err := bpf.LoadSock()
	if err != nil {
		return nil, fmt.Errorf("load embedded socket LB object: %w", err)
	}
	opened := map[string]*ebpf.Map{}
	for _, name := range lbNames {
		ms, ok := spec.Maps[name]
		if !ok {
			closeMaps(opened)
			return nil, fmt.Errorf("embedded socket LB object has no map %s", name)
		}
		ms = ms.Copy()
		ms.Pinning = ebpf.PinByName
		m, err := ebpf.NewMapWithOptions(ms, ebpf.MapOptions{PinPath: dir})
		if err != nil {
			closeMaps(opened)
			return nil, fmt.Errorf("open map %s in %s: %w", name, dir, err)
		}
		opened[name] = m
	}
	return &LBMaps{Services: &LB4Services{m: opened[LB4ServicesMapName]},
		Backends: &LB4Backends{m: opened[LB4BackendsMapName]}, ReverseSK: opened[LB4ReverseSKMapName]}, nil
}

func closeMaps(ms map[string]*ebpf.Map) {
	for _, m := range ms {
		m.Close()
	}
}

// Close closes the file descriptors; the pinned maps stay.
func (m *LBMaps) Close() error {
	return errors.Join(m.Services.m.Close(), m.Backends.m.Close(), m.ReverseSK.Close())
}

// Replacements returns the maps to load the socket programs with
// (ebpf.CollectionOptions.MapReplacements).
func (m *LBMaps) Replacements() map[string]*ebpf.Map {
	return map[string]*ebpf.Map{
		LB4ServicesMapName:  m.Services.m,
		LB4BackendsMapName:  m.Backends.m,
		LB4ReverseSKMapName: m.ReverseSK,
	}
}

// UnpinLB removes the pins of the socket load balancer's maps in dir;
// missing pins are not an error.
func UnpinLB(dir string) error {
	var errs []error
	for _, name := range lbNames {
		if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("unpin %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// LB4Services is cellium_lb4_services.
type LB4Services struct{ m *ebpf.Map }

func lb4Key(k ServiceSlot) (bpf.SockLb4Key, error) {
	a, err := addrBE32(k.Frontend.Addr)
	if err != nil {
		return bpf.SockLb4Key{}, err
	}
	return bpf.SockLb4Key{Address: a, Dport: htons(k.Frontend.Port), Proto: k.Frontend.Proto, Slot: k.Slot}, nil
}

func lb4Slot(k *bpf.SockLb4Key) ServiceSlot {
	return ServiceSlot{Frontend: lb.L4Addr{Addr: be32Addr(k.Address), Port: ntohs(k.Dport), Proto: k.Proto}, Slot: k.Slot}
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
		vs[i] = bpf.SockLb4Service{BackendId: vals[i].BackendID, Count: vals[i].Count}
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
	return ServiceValue{BackendID: v.BackendId, Count: v.Count}, nil
}

// Iterate calls yield for every entry until it returns false.
func (s *LB4Services) Iterate(yield func(ServiceSlot, ServiceValue) bool) error {
	return iterate(s.m, func(k *bpf.SockLb4Key, v *bpf.SockLb4Service) bool {
		return yield(lb4Slot(k), ServiceValue{BackendID: v.BackendId, Count: v.Count})
	})
}

// LB4Backends is cellium_lb4_backends.
type LB4Backends struct{ m *ebpf.Map }

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
