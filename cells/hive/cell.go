package hive

import (
	"fmt"
	"reflect"
	"regexp"

	"go.uber.org/fx"
)

// Cell is one building block of a hive: a module, a constructor, an invoked
// function, a config struct or a feature switch.
type Cell interface {
	// registerFlags adds the cell's flags (recursively) to the registry.
	registerFlags(r *flagRegistry, module *moduleInfo)
	// build returns the fx options for the cell, given the parsed flags.
	build(b *builder, module *moduleInfo) ([]fx.Option, error)
	// describe writes the cell's part of the introspection tree.
	describe(p *printer, b *builder, module *moduleInfo)
}

var (
	moduleIDRe    = regexp.MustCompile(`^[a-z][a-z0-9_\-]{1,30}$`)
	moduleTitleRe = regexp.MustCompile(`^[a-zA-Z0-9_\-/.,:() ]{1,80}$`)
)

// moduleInfo is the scope a cell lives in.
type moduleInfo struct {
	id     string // full, dot-joined id
	title  string
	parent *moduleInfo
}

func (m *moduleInfo) fullID() string {
	if m == nil {
		return ""
	}
	return m.id
}

type module struct {
	id, title string
	cells     []Cell
}

// Module groups cells under an id and a title. The id must match
// ^[a-z][a-z0-9_-]{1,30}$ and the title ^[a-zA-Z0-9_-/.,:() ]{1,80}$; Module
// panics otherwise, since ids are written in code, not taken from input.
// Inside a module, *slog.Logger, Lifecycle, Health and Jobs are scoped to it.
func Module(id, title string, cells ...Cell) Cell {
	if !moduleIDRe.MatchString(id) {
		panic(fmt.Sprintf("hive.Module: invalid id %q: must match %s", id, moduleIDRe))
	}
	if !moduleTitleRe.MatchString(title) {
		panic(fmt.Sprintf("hive.Module(%s): invalid title %q: must match %s", id, title, moduleTitleRe))
	}
	return &module{id: id, title: title, cells: cells}
}

func (m *module) scope(parent *moduleInfo) *moduleInfo {
	id := m.id
	if parent != nil {
		id = parent.id + "." + m.id
	}
	return &moduleInfo{id: id, title: m.title, parent: parent}
}

func (m *module) registerFlags(r *flagRegistry, parent *moduleInfo) {
	scope := m.scope(parent)
	for _, c := range m.cells {
		c.registerFlags(r, scope)
	}
}

func (m *module) build(b *builder, parent *moduleInfo) ([]fx.Option, error) {
	scope := m.scope(parent)
	opts := []fx.Option{fx.Decorate(scopedProviders(scope)...)}
	for _, c := range m.cells {
		o, err := c.build(b, scope)
		if err != nil {
			return nil, err
		}
		opts = append(opts, o...)
	}
	return []fx.Option{fx.Module(m.id, opts...)}, nil
}

type group []Cell

// Group bundles cells without giving them a scope of their own.
func Group(cells ...Cell) Cell { return group(cells) }

func (g group) registerFlags(r *flagRegistry, module *moduleInfo) {
	for _, c := range g {
		c.registerFlags(r, module)
	}
}

func (g group) build(b *builder, module *moduleInfo) ([]fx.Option, error) {
	var opts []fx.Option
	for _, c := range g {
		o, err := c.build(b, module)
		if err != nil {
			return nil, err
		}
		opts = append(opts, o...)
	}
	return opts, nil
}

type provider struct {
	ctors   []any
	private bool
}

// Provide makes the constructors' results available to the whole hive.
// Constructors are plain functions; they should only validate and allocate
// and leave goroutines and I/O to lifecycle hooks and jobs.
func Provide(ctors ...any) Cell { return mustFuncs("Provide", &provider{ctors: ctors}, ctors) }

// ProvidePrivate makes the constructors' results available only inside the
// enclosing module and its sub-modules.
func ProvidePrivate(ctors ...any) Cell {
	return mustFuncs("ProvidePrivate", &provider{ctors: ctors, private: true}, ctors)
}

func (p *provider) registerFlags(*flagRegistry, *moduleInfo) {}

func (p *provider) build(_ *builder, _ *moduleInfo) ([]fx.Option, error) {
	opts := make([]fx.Option, 0, len(p.ctors))
	for _, c := range p.ctors {
		if p.private {
			opts = append(opts, fx.Provide(c, fx.Private))
		} else {
			opts = append(opts, fx.Provide(c))
		}
	}
	return opts, nil
}

type invoker struct{ funcs []any }

// Invoke runs the functions when the hive is populated, instantiating what
// they take. Use it sparingly: to register hooks or jobs of something nobody
// else depends on.
func Invoke(funcs ...any) Cell { return mustFuncs("Invoke", &invoker{funcs: funcs}, funcs) }

func (i *invoker) registerFlags(*flagRegistry, *moduleInfo) {}

func (i *invoker) build(_ *builder, _ *moduleInfo) ([]fx.Option, error) {
	return []fx.Option{fx.Invoke(i.funcs...)}, nil
}

func mustFuncs[C Cell](what string, c C, fns []any) C {
	for _, fn := range fns {
		if fn == nil || reflect.TypeOf(fn).Kind() != reflect.Func {
			panic(fmt.Sprintf("hive.%s: %T is not a function", what, fn))
		}
	}
	return c
}
