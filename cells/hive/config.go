package hive

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"go.uber.org/fx"
)

// Flagger is implemented by config structs: Flags registers one flag per
// exported field, with the struct's values as defaults.
type Flagger interface {
	Flags(*pflag.FlagSet)
}

// Validator is implemented by config structs that check their values after
// the flags are parsed. The error should name the flag and the values it
// accepts; start-up stops with it.
type Validator interface {
	Validate() error
}

type configCell[T Flagger] struct {
	def T
}

// Config declares a config struct with its defaults. Its Flags method
// registers the flags; after parsing, each exported field is filled from the
// flag of the same name (case-insensitive, dashes removed) or the flag named
// by a `flag:"name"` tag; a bool field tagged `changed:"name"` instead
// tells whether that flag was given (for a deprecated flag that only
// counts when set). An exported field without a flag is an error. The
// decoded T is provided to the hive (to everyone: config is read-only).
func Config[T Flagger](def T) Cell { return &configCell[T]{def: def} }

func (c *configCell[T]) registerFlags(r *flagRegistry, module *moduleInfo) {
	fs := pflag.NewFlagSet(module.fullID(), pflag.ContinueOnError)
	c.def.Flags(fs)
	r.add(module, fs, c)
}

func (c *configCell[T]) build(b *builder, _ *moduleInfo) ([]fx.Option, error) {
	v, err := decodeConfig(c.def, b.flags.fs)
	if err != nil {
		return nil, err
	}
	return []fx.Option{fx.Supply(v)}, nil
}

// decodeConfig fills a copy of def from the parsed flags and validates it.
func decodeConfig[T Flagger](def T, fs *pflag.FlagSet) (T, error) {
	out := def
	rv := reflect.ValueOf(&out).Elem()
	if rv.Kind() != reflect.Struct {
		return out, fmt.Errorf("config %T: must be a struct", def)
	}
	own := pflag.NewFlagSet("", pflag.ContinueOnError)
	def.Flags(own)
	byKey := map[string]string{}
	own.VisitAll(func(f *pflag.Flag) { byKey[normalizeFlagKey(f.Name)] = f.Name })

	rt := rv.Type()
	for i := range rt.NumField() {
		field := rt.Field(i)
		if !field.IsExported() {
			continue
		}
		if of := field.Tag.Get("changed"); of != "" {
			// The field says whether flag "of" was given (on the
			// command line or in the environment), not its value.
			flag := fs.Lookup(of)
			if flag == nil || field.Type.Kind() != reflect.Bool {
				return out, fmt.Errorf("config %T: field %s tagged `changed:%q` must be a bool naming a flag", def, field.Name, of)
			}
			rv.Field(i).SetBool(flag.Changed)
			continue
		}
		name := field.Tag.Get("flag")
		if name == "" {
			name = byKey[normalizeFlagKey(field.Name)]
		}
		flag := fs.Lookup(name)
		if name == "" || flag == nil {
			return out, fmt.Errorf("config %T: field %s has no flag: register one in Flags or tag it `flag:\"name\"`", def, field.Name)
		}
		if err := setField(rv.Field(i), flag); err != nil {
			return out, fmt.Errorf("invalid value %q for --%s: %w", flag.Value.String(), flag.Name, err)
		}
	}
	if v, ok := any(out).(Validator); ok {
		if err := v.Validate(); err != nil {
			return out, err
		}
	}
	return out, nil
}

func normalizeFlagKey(s string) string {
	return strings.ToLower(strings.NewReplacer("-", "", "_", "", ".", "").Replace(s))
}

var durationType = reflect.TypeFor[time.Duration]()

func setField(fv reflect.Value, flag *pflag.Flag) error {
	s := flag.Value.String()
	if fv.Type() == durationType {
		d, err := time.ParseDuration(s)
		if err != nil {
			return err
		}
		fv.SetInt(int64(d))
		return nil
	}
	switch fv.Kind() {
	case reflect.String:
		fv.SetString(s)
	case reflect.Bool:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return err
		}
		fv.SetBool(b)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		n, err := strconv.ParseInt(s, 0, fv.Type().Bits())
		if err != nil {
			return err
		}
		fv.SetInt(n)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		n, err := strconv.ParseUint(s, 0, fv.Type().Bits())
		if err != nil {
			return err
		}
		fv.SetUint(n)
	case reflect.Float32, reflect.Float64:
		n, err := strconv.ParseFloat(s, fv.Type().Bits())
		if err != nil {
			return err
		}
		fv.SetFloat(n)
	case reflect.Slice:
		if fv.Type().Elem().Kind() != reflect.String {
			return fmt.Errorf("unsupported config field type %s", fv.Type())
		}
		var items []string
		if sv, ok := flag.Value.(pflag.SliceValue); ok {
			items = sv.GetSlice()
		} else if s != "" {
			items = strings.Split(s, ",")
		}
		fv.Set(reflect.ValueOf(items).Convert(fv.Type()))
	case reflect.Map:
		if fv.Type().Key().Kind() != reflect.String || fv.Type().Elem().Kind() != reflect.String {
			return fmt.Errorf("unsupported config field type %s", fv.Type())
		}
		m := map[string]string{}
		s = strings.Trim(s, "[]")
		for kv := range strings.SplitSeq(s, ",") {
			if kv == "" {
				continue
			}
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				return fmt.Errorf("%q is not key=value", kv)
			}
			m[k] = v
		}
		fv.Set(reflect.ValueOf(m).Convert(fv.Type()))
	default:
		return fmt.Errorf("unsupported config field type %s", fv.Type())
	}
	return nil
}

// flagRegistry collects the flags of every cell, grouped by module.
type flagRegistry struct {
	fs     *pflag.FlagSet
	groups []FlagGroup
	owner  map[string]string // flag name -> module id
	errs   []error
}

// FlagGroup is the set of flags one module declares, for --help.
type FlagGroup struct {
	ModuleID string
	Title    string
	Flags    *pflag.FlagSet
}

func newFlagRegistry() *flagRegistry {
	return &flagRegistry{fs: pflag.NewFlagSet("hive", pflag.ContinueOnError), owner: map[string]string{}}
}

func (r *flagRegistry) add(module *moduleInfo, fs *pflag.FlagSet, _ any) {
	id, title := module.fullID(), ""
	if module != nil {
		title = module.title
	}
	fs.VisitAll(func(f *pflag.Flag) {
		if prev, dup := r.owner[f.Name]; dup {
			r.errs = append(r.errs, fmt.Errorf("flag --%s declared by both %q and %q", f.Name, prev, id))
			return
		}
		r.owner[f.Name] = id
		r.fs.AddFlag(f)
	})
	for i := range r.groups {
		if r.groups[i].ModuleID == id {
			r.groups[i].Flags.AddFlagSet(fs)
			return
		}
	}
	r.groups = append(r.groups, FlagGroup{ModuleID: id, Title: title, Flags: fs})
}

// EnvPrefix is the prefix of environment variables that set flags:
// CELLIUM_K8S_CLIENT_QPS sets --k8s-client-qps.
const EnvPrefix = "CELLIUM_"

// applyEnv sets every flag not given on the command line from its
// environment variable, if present.
func (r *flagRegistry) applyEnv(lookup func(string) (string, bool)) error {
	var errs []error
	r.fs.VisitAll(func(f *pflag.Flag) {
		if f.Changed {
			return
		}
		env := EnvPrefix + strings.ToUpper(strings.NewReplacer("-", "_", ".", "_").Replace(f.Name))
		if v, ok := lookup(env); ok {
			if err := r.fs.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("invalid value %q for --%s (from $%s): %w", v, f.Name, env, err))
			}
		}
	})
	return errors.Join(errs...)
}

func osLookupEnv(k string) (string, bool) { return os.LookupEnv(k) }

// sortedFlags returns the flags of fs by name.
func sortedFlags(fs *pflag.FlagSet) []*pflag.Flag {
	var out []*pflag.Flag
	fs.VisitAll(func(f *pflag.Flag) { out = append(out, f) })
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// FlagValues reads the current value of every flag of the hive, for
// `GET /v1/config` and `cellium config get`.
type FlagValues struct{ fs *pflag.FlagSet }

// All returns flag name -> current value.
func (f FlagValues) All() map[string]string {
	out := map[string]string{}
	if f.fs == nil {
		return out
	}
	f.fs.VisitAll(func(fl *pflag.Flag) { out[fl.Name] = fl.Value.String() })
	return out
}
