package hive

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/cilium/statedb"
	"github.com/spf13/pflag"
	"go.uber.org/fx"
	"go.uber.org/fx/fxevent"
)

// Options tune a hive. The zero value is usable.
type Options struct {
	// Logger is the root logger; modules get children with a "module"
	// attribute. Defaults to slog.Default().
	Logger *slog.Logger
	// StartTimeout and StopTimeout bound the whole start and stop; hooks
	// have their own Timeout. Defaults: 5 minutes and 1 minute.
	StartTimeout, StopTimeout time.Duration
	// LookupEnv reads environment variables that set flags (EnvPrefix).
	// Defaults to os.LookupEnv; tests pass a map lookup.
	LookupEnv func(string) (string, bool)
}

// Hive is a set of cells made into a running application.
type Hive struct {
	cells []Cell
	opts  Options
	flags *flagRegistry

	app       *fx.App
	lc        *lifecycle
	health    *healthRegistry
	dot       fx.DotGraph
	populated bool
}

// New creates a hive from cells and registers their flags. Nothing is
// constructed until Populate (or Start) runs.
func New(cells ...Cell) *Hive { return NewWithOptions(Options{}, cells...) }

// NewWithOptions is New with options.
func NewWithOptions(opts Options, cells ...Cell) *Hive {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = 5 * time.Minute
	}
	if opts.StopTimeout <= 0 {
		opts.StopTimeout = time.Minute
	}
	if opts.LookupEnv == nil {
		opts.LookupEnv = osLookupEnv
	}
	h := &Hive{cells: cells, opts: opts, flags: newFlagRegistry(), health: newHealthRegistry()}
	for _, c := range cells {
		c.registerFlags(h.flags, nil)
	}
	return h
}

// Flags returns every flag of every cell; parse the command line into it
// before Populate.
func (h *Hive) Flags() *pflag.FlagSet { return h.flags.fs }

// FlagGroups returns the flags grouped by the module that declares them,
// in declaration order.
func (h *Hive) FlagGroups() []FlagGroup { return h.flags.groups }

// builder carries what cells need while turning into fx options.
type builder struct {
	flags *flagRegistry
}

// Populate reads environment variables into unset flags, decodes and
// validates every Config, and builds the object graph, running the
// constructors that invoked functions need. It does not start anything.
func (h *Hive) Populate() error {
	if h.populated {
		return nil
	}
	if err := errors.Join(h.flags.errs...); err != nil {
		return err
	}
	if err := h.flags.applyEnv(h.opts.LookupEnv); err != nil {
		return err
	}
	opts, err := h.options()
	if err != nil {
		return err
	}
	h.app = fx.New(opts...)
	if err := h.app.Err(); err != nil {
		return fmt.Errorf("build hive: %w", err)
	}
	h.populated = true
	return nil
}

// options builds the fx options of the whole graph.
func (h *Hive) options() ([]fx.Option, error) {
	b := &builder{flags: h.flags}
	var cellOpts []fx.Option
	for _, c := range h.cells {
		o, err := c.build(b, nil)
		if err != nil {
			return nil, err
		}
		cellOpts = append(cellOpts, o...)
	}
	log := h.opts.Logger
	root := []fx.Option{
		fx.WithLogger(func() fxevent.Logger {
			l := &fxevent.SlogLogger{Logger: log}
			l.UseLogLevel(slog.LevelDebug)
			l.UseErrorLevel(slog.LevelError)
			return l
		}),
		fx.StartTimeout(h.opts.StartTimeout),
		fx.StopTimeout(h.opts.StopTimeout),
		fx.RecoverFromPanics(),
		fx.Provide(
			func(flc fx.Lifecycle) *rootDeps {
				h.lc = &lifecycle{fx: flc, log: log}
				return &rootDeps{lc: h.lc, health: h.health, log: log}
			},
			func(r *rootDeps) HookStats { return r.lc },
			func() HealthReporter { return h.health },
			newDB,
		),
		fx.Provide(scopedProviders(nil)...),
		// The lifecycle recorder must exist even if no cell asks for it.
		fx.Invoke(func(*rootDeps) {}),
		fx.Populate(&h.dot),
		fx.Supply(FlagValues{fs: h.flags.fs}),
	}
	return append(root, cellOpts...), nil
}

// newDB provides the state database, started and stopped with the hive.
func newDB(lc Lifecycle) *statedb.DB {
	db := statedb.New()
	lc.Append(Hook{
		Name:    "statedb",
		OnStart: func(context.Context) error { return db.Start() },
		OnStop:  func(context.Context) error { return db.Stop() },
	})
	return db
}

// rootDeps are the hive-wide registries the scoped values are made from.
type rootDeps struct {
	lc     *lifecycle
	health *healthRegistry
	log    *slog.Logger
}

// scopedProviders make the logger, lifecycle, health and jobs of module m
// (nil: the root). They are provided at the root and decorated in every
// module, so each module sees its own.
func scopedProviders(m *moduleInfo) []any {
	id := m.fullID()
	logger := func(r *rootDeps) *slog.Logger {
		if id == "" {
			return r.log
		}
		return r.log.With("module", id)
	}
	return []any{
		logger,
		func(r *rootDeps) Lifecycle { return scopedLifecycle{root: r.lc, module: id} },
		func(r *rootDeps) Health { return scopedHealth{reg: r.health, module: id} },
		func(r *rootDeps) Jobs {
			return scopedJobs{
				lc:     scopedLifecycle{root: r.lc, module: id},
				health: scopedHealth{reg: r.health, module: id},
				log:    logger(r),
			}
		},
	}
}

// Start populates the hive if needed and runs the start hooks. If one
// fails, the hooks that already ran are stopped and the error returned.
func (h *Hive) Start(ctx context.Context) error {
	if err := h.Populate(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, h.opts.StartTimeout)
	defer cancel()
	return h.app.Start(ctx)
}

// Stop runs the stop hooks in reverse order.
func (h *Hive) Stop(ctx context.Context) error {
	if h.app == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, h.opts.StopTimeout)
	defer cancel()
	return h.app.Stop(ctx)
}

// Run starts the hive, waits for SIGINT/SIGTERM, ctx's end, or a Shutdown
// request from a cell, then stops it.
func (h *Hive) Run(ctx context.Context) error {
	if err := h.Start(ctx); err != nil {
		return err
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	var cause error
	select {
	case s := <-sigs:
		h.opts.Logger.Info("signal received, stopping", "signal", s.String())
	case <-ctx.Done():
	case sig := <-h.app.Wait():
		if sig.ExitCode != 0 {
			cause = fmt.Errorf("shutdown requested with exit code %d", sig.ExitCode)
		}
	}
	return errors.Join(cause, h.Stop(context.Background()))
}

// DotGraph returns the dependency graph in Graphviz DOT.
func (h *Hive) DotGraph() (string, error) {
	if err := h.Populate(); err != nil {
		return "", err
	}
	return string(h.dot), nil
}
