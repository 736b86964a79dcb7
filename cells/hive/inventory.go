package hive

import (
	"io"
	"slices"
	"strings"
)

// Inventory is what a populated hive is made of, for documentation and
// for checks that documentation is current: its modules in tree order,
// the types each provides and uses, and the jobs each runs.
type Inventory struct {
	Modules []ModuleInventory `json:"modules"`
}

// ModuleInventory is one module of an Inventory. Cells outside any module
// are listed under the ID "" (the hive's root). Cells of a Feature that
// is switched off are not in the graph and not listed.
type ModuleInventory struct {
	// ID is the module's full, dot-joined id, e.g. "agent.controlplane.ipam".
	ID    string `json:"id"`
	Title string `json:"title"`
	// Depth is 0 for a top-level module, 1 for its children, ...
	Depth int `json:"depth"`
	// Provides are the types the module's constructors return (fx.Out
	// fields expanded, error left out), sorted, without duplicates.
	Provides []string `json:"provides,omitempty"`
	// Uses are the parameter types of its constructors and invoked
	// functions (fx.In fields expanded), sorted, without duplicates.
	Uses []string `json:"uses,omitempty"`
	// Jobs are the jobs its constructors and invoked functions added, in
	// the order they start.
	Jobs []JobInventory `json:"jobs,omitempty"`
}

// JobInventory is a job of a module: its name and, when the job was
// described (DescribeJob), what it does.
type JobInventory struct {
	Name   string `json:"name"`
	Detail string `json:"detail,omitempty"`
}

// inventoryRecorder collects an Inventory while the cells describe
// themselves (the same walk as the `hive` listing).
type inventoryRecorder struct {
	inv   Inventory
	index map[string]int // module id -> index in inv.Modules
}

func (r *inventoryRecorder) module(m *moduleInfo) *ModuleInventory {
	id := m.fullID()
	i, ok := r.index[id]
	if !ok {
		depth := -1
		for p := m; p != nil; p = p.parent {
			depth++
		}
		title := ""
		if m != nil {
			title = m.title
		}
		i = len(r.inv.Modules)
		r.inv.Modules = append(r.inv.Modules, ModuleInventory{ID: id, Title: title, Depth: max(depth, 0)})
		r.index[id] = i
	}
	return &r.inv.Modules[i]
}

// Inventory populates the hive (see Populate: constructors run, nothing
// starts) and returns what it is made of.
func (h *Hive) Inventory() (Inventory, error) {
	if err := h.Populate(); err != nil {
		return Inventory{}, err
	}
	rec := &inventoryRecorder{index: map[string]int{}}
	p := &printer{w: io.Discard, rec: rec}
	b := &builder{flags: h.flags}
	for _, c := range h.cells {
		c.describe(p, b, nil)
	}
	for _, hk := range h.lc.Hooks() {
		name, ok := strings.CutPrefix(hk.Name, "job-")
		if !ok {
			continue
		}
		i, ok := rec.index[hk.Module]
		if !ok {
			i = len(rec.inv.Modules)
			rec.inv.Modules = append(rec.inv.Modules, ModuleInventory{ID: hk.Module})
			rec.index[hk.Module] = i
		}
		m := &rec.inv.Modules[i]
		m.Jobs = append(m.Jobs, JobInventory{Name: name, Detail: hk.Detail})
	}
	for i := range rec.inv.Modules {
		m := &rec.inv.Modules[i]
		slices.Sort(m.Provides)
		m.Provides = slices.Compact(m.Provides)
		slices.Sort(m.Uses)
		m.Uses = slices.Compact(m.Uses)
	}
	return rec.inv, nil
}
