package hive

import (
	"fmt"
	"strconv"

	"github.com/spf13/pflag"
	"go.uber.org/fx"
)

type feature struct {
	flag, usage string
	def         bool
	cells       []Cell
}

// Feature includes cells only when the boolean flag is true. When it is
// false the cells are left out of the graph entirely: nothing is
// constructed, no hook runs. The cells' own flags are still registered, so
// a command line stays valid whichever way the switch is set.
func Feature(flag string, def bool, usage string, cells ...Cell) Cell {
	return &feature{flag: flag, usage: usage, def: def, cells: cells}
}

func (f *feature) registerFlags(r *flagRegistry, module *moduleInfo) {
	fs := pflag.NewFlagSet(module.fullID(), pflag.ContinueOnError)
	fs.Bool(f.flag, f.def, f.usage)
	r.add(module, fs, f)
	for _, c := range f.cells {
		c.registerFlags(r, module)
	}
}

func (f *feature) enabled(fs *pflag.FlagSet) (bool, error) {
	fl := fs.Lookup(f.flag)
	if fl == nil {
		return f.def, nil
	}
	on, err := strconv.ParseBool(fl.Value.String())
	if err != nil {
		return false, fmt.Errorf("invalid value %q for --%s: want true or false", fl.Value.String(), f.flag)
	}
	return on, nil
}

func (f *feature) build(b *builder, module *moduleInfo) ([]fx.Option, error) {
	on, err := f.enabled(b.flags.fs)
	if err != nil || !on {
		return nil, err
	}
	return group(f.cells).build(b, module)
}
