package hive

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// tableTypeRe matches the statedb table types a module provides or uses:
// group 1 is "RW" for the writable handle, group 2 the row type.
var tableTypeRe = regexp.MustCompile(`^statedb\.(RW)?Table\[(.+)\]$`)

// TableInventory is a statedb table of an Inventory, known by its row
// type: the modules that hold its writable handle (statedb.RWTable) and
// those that only read it (statedb.Table).
type TableInventory struct {
	Row     string
	Writers []string
	Readers []string
}

// Tables lists the statedb tables the modules meet through, by row type,
// sorted: a module that provides or takes statedb.RWTable[T] writes T's
// table, one that takes statedb.Table[T] (and not the writable handle)
// reads it.
func (inv Inventory) Tables() []TableInventory {
	byRow := map[string]*TableInventory{}
	get := func(row string) *TableInventory {
		t, ok := byRow[row]
		if !ok {
			t = &TableInventory{Row: row}
			byRow[row] = t
		}
		return t
	}
	for _, m := range inv.Modules {
		writes := map[string]bool{}
		for _, typ := range slices.Concat(m.Provides, m.Uses) {
			if g := tableTypeRe.FindStringSubmatch(baseType(typ)); g != nil && g[1] == "RW" {
				writes[g[2]] = true
			}
		}
		for row := range writes {
			t := get(row)
			t.Writers = append(t.Writers, moduleName(m.ID))
		}
		for _, typ := range m.Uses {
			if g := tableTypeRe.FindStringSubmatch(baseType(typ)); g != nil && g[1] == "" && !writes[g[2]] {
				t := get(g[2])
				if !slices.Contains(t.Readers, moduleName(m.ID)) {
					t.Readers = append(t.Readers, moduleName(m.ID))
				}
			}
		}
	}
	var out []TableInventory
	for _, t := range byRow {
		slices.Sort(t.Writers)
		slices.Sort(t.Readers)
		out = append(out, *t)
	}
	slices.SortFunc(out, func(a, b TableInventory) int { return strings.Compare(a.Row, b.Row) })
	return out
}

// baseType drops the "(optional)" and "(group ...)" notes of a listed type.
func baseType(typ string) string {
	if i := strings.Index(typ, " ("); i >= 0 {
		return typ[:i]
	}
	return typ
}

func moduleName(id string) string {
	if id == "" {
		return "(root)"
	}
	return id
}

// Markdown renders inv for the architecture page: the module tree with
// titles, the statedb tables (Tables) with writers and readers, and the
// reconcilers (jobs named reconcile-*) with their table and target. It is
// deterministic, so a test can compare it with the page.
func (inv Inventory) Markdown(binary string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "#### %s: modules\n\n", binary)
	for _, m := range inv.Modules {
		if m.ID == "" {
			continue
		}
		fmt.Fprintf(&b, "%s- `%s`: %s\n", strings.Repeat("  ", m.Depth), lastID(m.ID), m.Title)
	}
	fmt.Fprintf(&b, "\n#### %s: tables (by row type)\n\n", binary)
	b.WriteString("| row type | written by | read by |\n|---|---|---|\n")
	for _, t := range inv.Tables() {
		fmt.Fprintf(&b, "| `%s` | %s | %s |\n", t.Row, codeList(t.Writers), codeList(t.Readers))
	}
	fmt.Fprintf(&b, "\n#### %s: reconcilers\n\n", binary)
	var rows []string
	for _, m := range inv.Modules {
		for _, j := range m.Jobs {
			if name, ok := strings.CutPrefix(j.Name, "reconcile-"); ok {
				rows = append(rows, fmt.Sprintf("| `%s` | `%s` | %s |\n", name, moduleName(m.ID), pkgPathRe.ReplaceAllString(j.Detail, "")))
			}
		}
	}
	if len(rows) == 0 {
		b.WriteString("None in the hive at start.\n")
		return b.String()
	}
	b.WriteString("| reconciler | module | table → target |\n|---|---|---|\n")
	b.WriteString(strings.Join(rows, ""))
	return b.String()
}

func lastID(id string) string {
	if i := strings.LastIndexByte(id, '.'); i >= 0 {
		return id[i+1:]
	}
	return id
}

func codeList(ids []string) string {
	if len(ids) == 0 {
		return "none"
	}
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = "`" + id + "`"
	}
	return strings.Join(out, ", ")
}
