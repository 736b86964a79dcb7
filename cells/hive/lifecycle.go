package hive

import (
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"time"

	"go.uber.org/fx"
)

// DefaultHookTimeout bounds a start or stop hook that sets no Timeout.
const DefaultHookTimeout = time.Minute

// Hook is a pair of functions run when the hive starts and stops. Start
// hooks run in the order they were appended, stop hooks in reverse.
type Hook struct {
	// Name shows in logs and in the `hive` listing; defaults to the
	// function name of OnStart (or OnStop).
	Name string
	// OnStart runs at start; an error aborts start-up and stops what
	// already started.
	OnStart func(ctx context.Context) error
	// OnStop runs at stop; it must wait for what OnStart started.
	OnStop func(ctx context.Context) error
	// Timeout bounds each of OnStart and OnStop; 0 means DefaultHookTimeout.
	Timeout time.Duration
	// Detail says what the hook runs, for the hive's inventory (e.g. a
	// reconciler's table and target); may be empty.
	Detail string
}

// Lifecycle registers hooks of the enclosing module.
type Lifecycle interface {
	// Append adds a hook. Call it from constructors and invoked functions,
	// not after the hive has started.
	Append(Hook)
}

// HookInfo describes a registered hook and how long it took.
type HookInfo struct {
	Module        string        `json:"module"`
	Name          string        `json:"name"`
	Detail        string        `json:"detail,omitempty"`
	HasStart      bool          `json:"hasStart"`
	HasStop       bool          `json:"hasStop"`
	StartDuration time.Duration `json:"startDuration,omitempty"`
	StopDuration  time.Duration `json:"stopDuration,omitempty"`
}

// HookStats lists the hooks of a hive with their measured durations.
type HookStats interface {
	Hooks() []HookInfo
}

// lifecycle is the hive-wide hook registry; scopedLifecycle adds the
// module id.
type lifecycle struct {
	fx    fx.Lifecycle
	log   *slog.Logger
	mu    sync.Mutex
	hooks []HookInfo
}

func (l *lifecycle) Hooks() []HookInfo {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]HookInfo(nil), l.hooks...)
}

func (l *lifecycle) record(i int, start bool, d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if start {
		l.hooks[i].StartDuration = d
	} else {
		l.hooks[i].StopDuration = d
	}
}

type scopedLifecycle struct {
	root   *lifecycle
	module string
}

func (s scopedLifecycle) Append(h Hook) {
	l := s.root
	if h.Name == "" {
		h.Name = funcName(h.OnStart)
		if h.OnStart == nil {
			h.Name = funcName(h.OnStop)
		}
	}
	timeout := h.Timeout
	if timeout <= 0 {
		timeout = DefaultHookTimeout
	}
	l.mu.Lock()
	idx := len(l.hooks)
	l.hooks = append(l.hooks, HookInfo{Module: s.module, Name: h.Name, Detail: h.Detail, HasStart: h.OnStart != nil, HasStop: h.OnStop != nil})
	l.mu.Unlock()

	log := l.log.With("module", s.module, "hook", h.Name)
	run := func(ctx context.Context, phase string, fn func(context.Context) error) error {
		if fn == nil {
			return nil
		}
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		t0 := time.Now()
		err := fn(ctx)
		d := time.Since(t0)
		l.record(idx, phase == "start", d)
		if err != nil {
			if ctx.Err() != nil {
				err = fmt.Errorf("%w (hook timeout %s)", err, timeout)
			}
			log.Error(phase+" hook failed", "duration", d, "error", err)
			return fmt.Errorf("%s hook %s (%s): %w", phase, h.Name, s.module, err)
		}
		log.Debug(phase+" hook done", "duration", d)
		return nil
	}
	l.fx.Append(fx.Hook{
		OnStart: func(ctx context.Context) error { return run(ctx, "start", h.OnStart) },
		OnStop:  func(ctx context.Context) error { return run(ctx, "stop", h.OnStop) },
	})
}

// funcName is the short name of a function value: pkg.Func or pkg.(*T).M.
func funcName(fn any) string {
	if fn == nil {
		return "<nil>"
	}
	v := reflect.ValueOf(fn)
	if v.Kind() != reflect.Func {
		return fmt.Sprintf("%T", fn)
	}
	f := runtime.FuncForPC(v.Pointer())
	if f == nil {
		return "<unknown>"
	}
	name := f.Name()
	if i := strings.LastIndex(name, "/"); i >= 0 {
		name = name[i+1:]
	}
	return strings.TrimSuffix(name, "-fm")
}

// funcLocation is "file.go:line" of a function value.
func funcLocation(fn any) string {
	f := runtime.FuncForPC(reflect.ValueOf(fn).Pointer())
	if f == nil {
		return "?"
	}
	file, line := f.FileLine(f.Entry())
	if i := strings.LastIndex(file, "/"); i >= 0 {
		file = file[i+1:]
	}
	return fmt.Sprintf("%s:%d", file, line)
}
