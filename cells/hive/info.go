package hive

import (
	"fmt"
	"io"
	"reflect"
	"regexp"
	"slices"
	"strings"

	"github.com/spf13/pflag"
	"go.uber.org/fx"
)

// printer writes the cell tree shown by the `hive` command.
type printer struct {
	w        io.Writer
	disabled bool               // inside a Feature that is switched off
	rec      *inventoryRecorder // collects Hive.Inventory when not nil
}

// record returns the inventory entry of module when an inventory is being
// collected and the cells are in the graph, nil otherwise.
func (p *printer) record(module *moduleInfo) *ModuleInventory {
	if p.rec == nil || p.disabled {
		return nil
	}
	return p.rec.module(module)
}

func (p *printer) line(indent int, format string, args ...any) {
	fmt.Fprintf(p.w, "%s%s\n", strings.Repeat(" ", indent), fmt.Sprintf(format, args...))
}

// PrintInfo populates the hive and writes its cell tree (modules, their
// providers with inputs and outputs, invoked functions, config flags with
// default and current values, feature switches) and the start and stop
// hooks in the order they run.
func (h *Hive) PrintInfo(w io.Writer) error {
	if err := h.Populate(); err != nil {
		return err
	}
	p := &printer{w: w}
	b := &builder{flags: h.flags}
	p.line(0, "Cells:")
	p.line(0, "")
	for _, c := range h.cells {
		c.describe(p, b, nil)
	}
	p.line(0, "Start hooks:")
	p.line(0, "")
	hooks := h.lc.Hooks()
	for _, hk := range hooks {
		if hk.HasStart {
			p.line(2, "• %s (%s)", hk.Name, moduleOrRoot(hk.Module))
		}
	}
	p.line(0, "")
	p.line(0, "Stop hooks:")
	p.line(0, "")
	for _, hk := range slices.Backward(hooks) {
		if hk.HasStop {
			p.line(2, "• %s (%s)", hk.Name, moduleOrRoot(hk.Module))
		}
	}
	return nil
}

func moduleOrRoot(id string) string {
	if id == "" {
		return "hive"
	}
	return id
}

func indentOf(m *moduleInfo) int {
	n := 2
	for ; m != nil; m = m.parent {
		n += 4
	}
	return n
}

func (m *module) describe(p *printer, b *builder, parent *moduleInfo) {
	scope := m.scope(parent)
	p.line(indentOf(parent), "Ⓜ️ %s (%s):", m.id, m.title)
	p.record(scope)
	for _, c := range m.cells {
		c.describe(p, b, scope)
	}
	p.line(0, "")
}

func (g group) describe(p *printer, b *builder, module *moduleInfo) {
	for _, c := range g {
		c.describe(p, b, module)
	}
}

func (pr *provider) describe(p *printer, _ *builder, module *moduleInfo) {
	in := indentOf(module)
	for _, ctor := range pr.ctors {
		lock := ""
		if pr.private {
			lock = "🔒️"
		}
		p.line(in, "🚧%s %s (%s):", lock, funcName(ctor), funcLocation(ctor))
		t := reflect.TypeOf(ctor)
		ins, outs := funcInputs(t), funcOutputs(t)
		if len(ins) > 0 {
			p.line(in+4, "⇨ %s", strings.Join(ins, ", "))
		}
		if len(outs) > 0 {
			p.line(in+4, "⇦ %s", strings.Join(outs, ", "))
		}
		if r := p.record(module); r != nil {
			r.Uses = append(r.Uses, ins...)
			r.Provides = append(r.Provides, outs...)
		}
	}
}

func (iv *invoker) describe(p *printer, _ *builder, module *moduleInfo) {
	in := indentOf(module)
	for _, fn := range iv.funcs {
		p.line(in, "🛠️ %s (%s)", funcName(fn), funcLocation(fn))
		ins := funcInputs(reflect.TypeOf(fn))
		if len(ins) > 0 {
			p.line(in+4, "⇨ %s", strings.Join(ins, ", "))
		}
		if r := p.record(module); r != nil {
			r.Uses = append(r.Uses, ins...)
		}
	}
}

func (c *configCell[T]) describe(p *printer, b *builder, module *moduleInfo) {
	in := indentOf(module)
	p.line(in, "⚙️ (%s)", shortType(reflect.TypeFor[T]()))
	own := pflag.NewFlagSet("", pflag.ContinueOnError)
	c.def.Flags(own)
	for _, f := range sortedFlags(own) {
		cur := f
		if parsed := b.flags.fs.Lookup(f.Name); parsed != nil {
			cur = parsed
		}
		p.line(in+4, "--%s=%s (default %s)", f.Name, flagValue(cur), flagDefault(f))
	}
}

func (f *feature) describe(p *printer, b *builder, module *moduleInfo) {
	on, _ := f.enabled(b.flags.fs)
	state := "enabled"
	if !on {
		state = "disabled: the cells below are not in the graph"
	}
	p.line(indentOf(module), "🚩 --%s=%t (default %t): %s", f.flag, on, f.def, state)
	wasDisabled := p.disabled
	p.disabled = p.disabled || !on
	for _, c := range f.cells {
		c.describe(p, b, module)
	}
	p.disabled = wasDisabled
}

func flagValue(f *pflag.Flag) string {
	if sv, ok := f.Value.(pflag.SliceValue); ok {
		return "[" + strings.Join(sv.GetSlice(), ",") + "]"
	}
	return quoteIfEmpty(f.Value.String())
}

func flagDefault(f *pflag.Flag) string { return quoteIfEmpty(f.DefValue) }

func quoteIfEmpty(s string) string {
	if s == "" {
		return `""`
	}
	return s
}

var (
	fxIn  = reflect.TypeFor[fx.In]()
	fxOut = reflect.TypeFor[fx.Out]()
)

// funcInputs lists a function's parameter types, expanding fx.In structs.
func funcInputs(t reflect.Type) []string {
	var out []string
	for i := range t.NumIn() {
		out = append(out, expandStruct(t.In(i), fxIn)...)
	}
	slices.Sort(out)
	return out
}

// funcOutputs lists a function's result types, without error and
// expanding fx.Out structs.
func funcOutputs(t reflect.Type) []string {
	var out []string
	errType := reflect.TypeFor[error]()
	for i := range t.NumOut() {
		if t.Out(i) == errType {
			continue
		}
		out = append(out, expandStruct(t.Out(i), fxOut)...)
	}
	slices.Sort(out)
	return out
}

func expandStruct(t reflect.Type, marker reflect.Type) []string {
	if t.Kind() != reflect.Struct || !embeds(t, marker) {
		return []string{shortType(t)}
	}
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Anonymous && f.Type == marker {
			continue
		}
		s := shortType(f.Type)
		if g := f.Tag.Get("group"); g != "" {
			s += fmt.Sprintf(" (group %s)", strings.Split(g, ",")[0])
		}
		if f.Tag.Get("optional") == "true" {
			s += " (optional)"
		}
		out = append(out, s)
	}
	return out
}

func embeds(t, marker reflect.Type) bool {
	for i := range t.NumField() {
		if f := t.Field(i); f.Anonymous && f.Type == marker {
			return true
		}
	}
	return false
}

var pkgPathRe = regexp.MustCompile(`[A-Za-z0-9_.\-]+(/[A-Za-z0-9_.\-]+)*/`)

// shortType drops import paths from a type name, also inside type
// arguments: statedb.Table[*pods.Pod].
func shortType(t reflect.Type) string {
	return pkgPathRe.ReplaceAllString(t.String(), "")
}
