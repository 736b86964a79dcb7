package lbsync

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"iter"

	"github.com/cilium/statedb"

	"github.com/cellium/cellium/datapath/maglev"
	"github.com/cellium/cellium/statedb/lb"
)

// MaglevMap is cellium_lb4_maglev as the reconciler uses it: a frontend's
// Maglev table. Swap replaces a frontend's table whole (the programs
// never see a half-written one); Delete must be idempotent.
type MaglevMap interface {
	Swap(fe lb.L4Addr, table []uint32) error
	Delete(fes []lb.L4Addr) error
	// Frontends lists the frontends that have a table.
	Frontends() ([]lb.L4Addr, error)
}

// Maglev is the Maglev table configuration of FrontendOps
// (WithMaglev).
type Maglev struct {
	Map MaglevMap
	// TableSize is the slots of a table (--bpf-lb-maglev-table-size);
	// 0 is --bpf-lb-algorithm=random: no frontend has a table, and the
	// tables of an earlier run go.
	TableSize uint32
	// Seed is --bpf-lb-maglev-hash-seed.
	Seed maglev.Seed

	// written is the fingerprint of the backends each frontend's table in
	// Map was last built from, so that an Update that changes nothing
	// (the reconciler's periodic full pass) does not rebuild and swap the
	// table. Made by WithMaglev; FrontendOps calls are serial.
	written map[lb.L4Addr]uint64
}

// FrontendOption configures FrontendOps.
type FrontendOption func(*FrontendOps)

// WithMaglev makes FrontendOps keep each external frontend's Maglev table
// in mg.Map in step with its backends: written (swapped in) before the
// frontend's external slot 0, deleted after it.
func WithMaglev(mg Maglev) FrontendOption {
	mg.written = map[lb.L4Addr]uint64{}
	return func(o *FrontendOps) { o.maglev = &mg }
}

// wants reports whether f has a table: Maglev is on and f is reached from
// outside the node (NodePort, LoadBalancer, externalIP, hostPort; not the
// 0.0.0.0 NodePort of the node's loopback, which only sockets use) and has
// backends.
func (mg *Maglev) wants(f *lb.Frontend) bool {
	return mg.TableSize > 0 && f.NodePort() && !f.Address.Addr.IsUnspecified() && len(f.Backends) > 0
}

// Table returns f's table: its external backends by address (the same on
// every node), holding their IDs.
func (mg *Maglev) Table(f *lb.Frontend) []uint32 {
	bs := make([]maglev.Backend, len(f.Backends))
	for i, b := range f.Backends {
		bs[i] = maglev.Backend{Name: b.String(), ID: f.BackendIDs[i]}
	}
	return maglev.Table(mg.TableSize, mg.Seed, bs)
}

// fingerprint sums up what f's table is built from: its backends' names
// and IDs in order (the table size and seed are fixed for mg).
func fingerprint(f *lb.Frontend) uint64 {
	h := fnv.New64a()
	var id [4]byte
	for i, b := range f.Backends {
		h.Write([]byte(b.String()))
		binary.LittleEndian.PutUint32(id[:], f.BackendIDs[i])
		h.Write(id[:])
	}
	return h.Sum64()
}

// update writes f's table, or deletes it when f wants none (a ClusterIP
// never has one: nothing to delete). A table already built from the same
// backends stays as it is.
func (mg *Maglev) update(f *lb.Frontend) error {
	if !f.NodePort() {
		return nil
	}
	if !mg.wants(f) {
		return mg.delete(f)
	}
	fp := fingerprint(f)
	if have, ok := mg.written[f.Address]; ok && have == fp {
		return nil
	}
	if err := mg.Map.Swap(f.Address, mg.Table(f)); err != nil {
		delete(mg.written, f.Address)
		return fmt.Errorf("maglev table: %w", err)
	}
	mg.written[f.Address] = fp
	return nil
}

func (mg *Maglev) delete(f *lb.Frontend) error {
	delete(mg.written, f.Address)
	if err := mg.Map.Delete([]lb.L4Addr{f.Address}); err != nil {
		return fmt.Errorf("delete maglev table: %w", err)
	}
	return nil
}

// prune deletes the tables of frontends no row of desired wants.
func (mg *Maglev) prune(desired iter.Seq2[*lb.Frontend, statedb.Revision]) error {
	have, err := mg.Map.Frontends()
	if err != nil {
		return fmt.Errorf("list maglev tables: %w", err)
	}
	want := map[lb.L4Addr]bool{}
	for f := range desired {
		if mg.wants(f) {
			want[f.Address] = true
		}
	}
	var stray []lb.L4Addr
	present := map[lb.L4Addr]bool{}
	for _, fe := range have {
		present[fe] = true
		if !want[fe] {
			stray = append(stray, fe)
			delete(mg.written, fe)
		}
	}
	// A table that left the map behind our back is built again by the
	// next update.
	for fe := range mg.written {
		if !present[fe] {
			delete(mg.written, fe)
		}
	}
	if err := mg.Map.Delete(stray); err != nil {
		return fmt.Errorf("prune %d maglev tables: %w", len(stray), err)
	}
	return nil
}
