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

// MaglevMapName is cellium_lb4_maglev (bpf/include/maglev.h): a frontend's
// Maglev table, for --bpf-lb-algorithm=maglev; also its pin name.
const MaglevMapName = bpf.NodeportMapCelliumLb4Maglev

// Maglev is cellium_lb4_maglev, open: a hash of maps from a frontend to
// its table, an array of backend IDs. Close it when done; the pin stays.
type Maglev struct {
	m     *ebpf.Map
	inner *ebpf.MapSpec
}

// OpenMaglev opens cellium_lb4_maglev pinned in dir (a bpffs directory),
// creating and pinning it when missing, with room for mapMax frontends
// (--bpf-lb-map-max, as Cilium sizes its Maglev map by default; 0 is
// DefaultLBMapMax; the map is not preallocated). A pin of another size or
// layout is replaced by a new, empty map (the tables are the agent's to
// write again; programs loaded after this call use the new one). Callers
// in one agent pass the same size; they are serialized by a lock on dir.
func OpenMaglev(dir string, mapMax int) (*Maglev, error) {
	if mapMax == 0 {
		mapMax = DefaultLBMapMax
	}
	if mapMax < 0 || mapMax > MaxLBMapMax {
		return nil, fmt.Errorf("maglev map size %d: want 1 to %d", mapMax, MaxLBMapMax)
	}
	spec, err := bpf.LoadNodeport()
	if err != nil {
		return nil, fmt.Errorf("load embedded nodeport object: %w", err)
	}
	ms, ok := spec.Maps[MaglevMapName]
	if !ok || ms.InnerMap == nil {
		return nil, fmt.Errorf("embedded nodeport object has no map of maps %s", MaglevMapName)
	}
	ms = ms.Copy()
	ms.Pinning = ebpf.PinByName
	ms.MaxEntries = uint32(mapMax)
	unlock, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	defer unlock()
	m, err := ebpf.NewMapWithOptions(ms, ebpf.MapOptions{PinPath: dir})
	if errors.Is(err, ebpf.ErrMapIncompatible) {
		if rerr := os.Remove(filepath.Join(dir, MaglevMapName)); rerr != nil {
			err = errors.Join(err, rerr)
		} else {
			m, err = ebpf.NewMapWithOptions(ms, ebpf.MapOptions{PinPath: dir})
		}
	}
	if err != nil {
		return nil, fmt.Errorf("open map %s in %s: %w", MaglevMapName, dir, err)
	}
	return &Maglev{m: m, inner: ms.InnerMap.Copy()}, nil
}

// Map is the outer map, for the loader's replacements.
func (g *Maglev) Map() *ebpf.Map { return g.m }

// Close closes the file descriptor; the pin stays.
func (g *Maglev) Close() error { return g.m.Close() }

func maglevKey(fe lb.L4Addr) (bpf.NodeportLb4MaglevKey, error) {
	a, err := addrBE32(fe.Addr)
	if err != nil {
		return bpf.NodeportLb4MaglevKey{}, err
	}
	return bpf.NodeportLb4MaglevKey{Address: a, Dport: htons(fe.Port), Proto: fe.Proto}, nil
}

// Swap makes table (backend IDs, its length the table size) fe's table: a
// new array is created and filled, then put in the outer map in one
// update, so the programs see the old table or the new one, never a mix.
func (g *Maglev) Swap(fe lb.L4Addr, table []uint32) error {
	if len(table) == 0 {
		return fmt.Errorf("maglev table of %v: empty", fe)
	}
	k, err := maglevKey(fe)
	if err != nil {
		return err
	}
	spec := g.inner.Copy()
	spec.MaxEntries = uint32(len(table))
	inner, err := ebpf.NewMap(spec)
	if err != nil {
		return fmt.Errorf("create maglev table of %v: %w", fe, err)
	}
	defer inner.Close()
	slots := make([]uint32, len(table))
	for i := range slots {
		slots[i] = uint32(i)
	}
	if err := batchUpdate(inner, slots, table); err != nil {
		return fmt.Errorf("fill maglev table of %v: %w", fe, err)
	}
	if err := g.m.Update(&k, inner, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("put maglev table of %v into %s: %w", fe, MaglevMapName, err)
	}
	return nil
}

// Delete removes the tables of fes; missing ones are not an error.
func (g *Maglev) Delete(fes []lb.L4Addr) error {
	for _, fe := range fes {
		k, err := maglevKey(fe)
		if err != nil {
			return err
		}
		if err := deleteKey(g.m, &k); err != nil {
			return err
		}
	}
	return nil
}

// Frontends returns the frontends that have a table.
func (g *Maglev) Frontends() ([]lb.L4Addr, error) {
	var out []lb.L4Addr
	err := iterate(g.m, func(k *bpf.NodeportLb4MaglevKey, _ *uint32) bool {
		out = append(out, lb.L4Addr{Addr: be32Addr(k.Address), Port: ntohs(k.Dport), Proto: k.Proto})
		return true
	})
	return out, err
}

// Table returns fe's table; ok is false when it has none.
func (g *Maglev) Table(fe lb.L4Addr) (table []uint32, ok bool, err error) {
	k, err := maglevKey(fe)
	if err != nil {
		return nil, false, err
	}
	var inner *ebpf.Map
	if err := g.m.Lookup(&k, &inner); err != nil {
		if isNotExist(err) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("look up maglev table of %v: %w", fe, err)
	}
	defer inner.Close()
	table = make([]uint32, inner.MaxEntries())
	for i := range table {
		if err := inner.Lookup(uint32(i), &table[i]); err != nil {
			return nil, false, fmt.Errorf("read maglev table of %v slot %d: %w", fe, i, err)
		}
	}
	return table, true, nil
}

// UnpinMaglev removes the pin of cellium_lb4_maglev in dir (the kube-proxy
// replacement is off); a missing pin is not an error.
func UnpinMaglev(dir string) error {
	if err := os.Remove(filepath.Join(dir, MaglevMapName)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("unpin %s: %w", MaglevMapName, err)
	}
	return nil
}
