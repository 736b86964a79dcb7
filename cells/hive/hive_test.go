package hive_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	"github.com/spf13/pflag"
	"go.uber.org/goleak"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type exampleConfig struct {
	ClientQPS  float64
	Mode       string
	Interval   time.Duration
	Labels     []string
	Enabled    bool `flag:"enable-thing"`
	unexported int
}

func (def exampleConfig) Flags(fs *pflag.FlagSet) {
	fs.Float64("client-qps", def.ClientQPS, "queries per second")
	fs.String("mode", def.Mode, "one of default, always, never")
	fs.Duration("interval", def.Interval, "how often")
	fs.StringSlice("labels", def.Labels, "labels")
	fs.Bool("enable-thing", def.Enabled, "enable the thing")
}

func (c exampleConfig) Validate() error {
	switch c.Mode {
	case "default", "always", "never":
		return nil
	}
	return fmt.Errorf("invalid value %q for --mode: must be one of default, always, never", c.Mode)
}

var defaultExample = exampleConfig{ClientQPS: 5, Mode: "default", Interval: time.Minute, Labels: []string{"a"}}

func TestConfigDefaultsAndFlags(t *testing.T) {
	var got exampleConfig
	hivetest.New(t, nil, hive.Module("example", "Example", hive.Config(defaultExample)), hivetest.Capture(&got)).Populate()
	if got.ClientQPS != 5 || got.Mode != "default" || got.Interval != time.Minute || len(got.Labels) != 1 {
		t.Fatalf("defaults not applied: %+v", got)
	}

	h := hivetest.New(t, []string{"--client-qps=7.5", "--mode=never", "--interval=3s", "--labels=x,y", "--enable-thing"},
		hive.Module("example", "Example", hive.Config(defaultExample)), hivetest.Capture(&got))
	if err := h.Populate(); err != nil {
		t.Fatal(err)
	}
	want := exampleConfig{ClientQPS: 7.5, Mode: "never", Interval: 3 * time.Second, Labels: []string{"x", "y"}, Enabled: true}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
}

// changedConfig has a deprecated flag whose field says whether it was
// given.
type changedConfig struct {
	Old    int
	OldSet bool `changed:"old"`
}

func (def changedConfig) Flags(fs *pflag.FlagSet) {
	fs.Int("old", def.Old, "an old flag")
}

func TestConfigChangedTag(t *testing.T) {
	for _, c := range []struct {
		args []string
		want changedConfig
	}{
		{nil, changedConfig{Old: 3}},
		// Given with its default value: still given.
		{[]string{"--old=3"}, changedConfig{Old: 3, OldSet: true}},
		{[]string{"--old=0"}, changedConfig{Old: 0, OldSet: true}},
	} {
		var got changedConfig
		if err := hivetest.New(t, c.args, hive.Module("example", "Example", hive.Config(changedConfig{Old: 3})), hivetest.Capture(&got)).Populate(); err != nil {
			t.Fatal(err)
		}
		if got != c.want {
			t.Errorf("%v: got %+v, want %+v", c.args, got, c.want)
		}
	}
}

func TestConfigValidationNamesFlag(t *testing.T) {
	h := hivetest.New(t, []string{"--mode=sometimes"}, hive.Module("example", "Example", hive.Config(defaultExample)))
	err := h.Populate()
	if err == nil || !strings.Contains(err.Error(), "--mode") || !strings.Contains(err.Error(), "default, always, never") {
		t.Fatalf("want error naming --mode and accepted values, got %v", err)
	}
}

func TestConfigBadTypeNamesFlag(t *testing.T) {
	h := hive.New(hive.Module("example", "Example", hive.Config(defaultExample)))
	err := h.Flags().Parse([]string{"--client-qps=fast"})
	if err == nil || !strings.Contains(err.Error(), "client-qps") {
		t.Fatalf("want parse error naming the flag, got %v", err)
	}
}

func TestConfigFromEnvironment(t *testing.T) {
	var got exampleConfig
	h := hive.NewWithOptions(hive.Options{
		Logger: hivetest.Discard(),
		LookupEnv: func(k string) (string, bool) {
			return map[string]string{"CELLIUM_CLIENT_QPS": "9"}[k], k == "CELLIUM_CLIENT_QPS"
		},
	}, hive.Module("example", "Example", hive.Config(defaultExample)), hivetest.Capture(&got))
	if err := h.Populate(); err != nil {
		t.Fatal(err)
	}
	if got.ClientQPS != 9 {
		t.Fatalf("env not applied: %+v", got)
	}
}

type missingFlagConfig struct{ Orphan string }

func (missingFlagConfig) Flags(*pflag.FlagSet) {}

func TestConfigFieldWithoutFlag(t *testing.T) {
	err := hivetest.New(t, nil, hive.Module("example", "Example", hive.Config(missingFlagConfig{}))).Populate()
	if err == nil || !strings.Contains(err.Error(), "Orphan") {
		t.Fatalf("want error about field Orphan, got %v", err)
	}
}

func TestDuplicateFlag(t *testing.T) {
	err := hivetest.New(t, nil,
		hive.Module("one", "One", hive.Config(defaultExample)),
		hive.Module("two", "Two", hive.Config(defaultExample)),
	).Populate()
	if err == nil || !strings.Contains(err.Error(), "declared by both") {
		t.Fatalf("want duplicate flag error, got %v", err)
	}
}

type service struct{ started, stopped atomic.Bool }

func TestFeatureAbsentWhenOff(t *testing.T) {
	constructed := 0
	cells := func() []hive.Cell {
		return []hive.Cell{hive.Feature("enable-service", true, "run the service",
			hive.Module("service", "Service",
				hive.Provide(func() *service { constructed++; return &service{} }),
				hive.Invoke(func(*service) {}),
			))}
	}
	if err := hivetest.New(t, []string{"--enable-service=false"}, cells()...).Populate(); err != nil {
		t.Fatal(err)
	}
	if constructed != 0 {
		t.Fatalf("disabled feature was constructed %d times", constructed)
	}
	// Asking for its type fails: it is not in the graph.
	err := hivetest.New(t, []string{"--enable-service=false"}, append(cells(), hive.Invoke(func(*service) {}))...).Populate()
	if err == nil || !strings.Contains(err.Error(), "missing type") {
		t.Fatalf("want missing type error, got %v", err)
	}
	if err := hivetest.New(t, nil, cells()...).Populate(); err != nil || constructed != 1 {
		t.Fatalf("enabled feature: err=%v constructed=%d", err, constructed)
	}
}

func TestPrivateProvide(t *testing.T) {
	type secret struct{}
	h := hivetest.New(t, nil,
		hive.Module("owner", "Owner", hive.ProvidePrivate(func() *secret { return &secret{} }), hive.Invoke(func(*secret) {})),
		hive.Module("other", "Other", hive.Invoke(func(*secret) {})),
	)
	if err := h.Populate(); err == nil {
		t.Fatal("private type reached another module")
	}
}

func TestLifecycleOrderTimeoutsAndStats(t *testing.T) {
	var order []string
	var mu sync.Mutex
	record := func(s string) { mu.Lock(); order = append(order, s); mu.Unlock() }
	var stats hive.HookStats
	h := hivetest.New(t, nil,
		hive.Module("first", "First", hive.Invoke(func(lc hive.Lifecycle) {
			lc.Append(hive.Hook{Name: "a", OnStart: func(context.Context) error { record("start a"); return nil },
				OnStop: func(context.Context) error { record("stop a"); return nil }})
		})),
		hive.Module("second", "Second", hive.Invoke(func(lc hive.Lifecycle) {
			lc.Append(hive.Hook{Name: "b", OnStart: func(context.Context) error {
				record("start b")
				time.Sleep(5 * time.Millisecond)
				return nil
			}, OnStop: func(context.Context) error { record("stop b"); return nil }})
		})),
		hivetest.Capture(&stats),
	)
	if err := h.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := h.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(order, ","); got != "start a,start b,stop b,stop a" {
		t.Fatalf("order %s", got)
	}
	var found bool
	for _, hk := range stats.Hooks() {
		if hk.Name == "b" {
			found = true
			if hk.Module != "second" || hk.StartDuration < 5*time.Millisecond {
				t.Fatalf("hook b stats wrong: %+v", hk)
			}
		}
	}
	if !found {
		t.Fatal("hook b not recorded")
	}
}

func TestHookTimeoutAbortsStart(t *testing.T) {
	stopped := false
	h := hivetest.New(t, nil, hive.Module("slow", "Slow", hive.Invoke(func(lc hive.Lifecycle) {
		lc.Append(hive.Hook{Name: "ok", OnStart: func(context.Context) error { return nil }, OnStop: func(context.Context) error { stopped = true; return nil }})
		lc.Append(hive.Hook{Name: "stuck", Timeout: 20 * time.Millisecond, OnStart: func(ctx context.Context) error {
			<-ctx.Done()
			return ctx.Err()
		}})
	})))
	err := h.Start(context.Background())
	if err == nil || !strings.Contains(err.Error(), "stuck") || !strings.Contains(err.Error(), "hook timeout 20ms") {
		t.Fatalf("want timeout error naming the hook, got %v", err)
	}
	if !stopped {
		t.Fatal("hooks that started were not stopped after a failed start")
	}
}

func TestJobsAndHealth(t *testing.T) {
	var (
		reporter hive.HealthReporter
		runs     atomic.Int32
		attempts atomic.Int32
	)
	h := hivetest.Start(t, nil,
		hive.Module("worker", "Worker", hive.Invoke(func(jobs hive.Jobs) {
			jobs.Add(
				hive.Timer("tick", func(context.Context) error { runs.Add(1); return nil }, time.Millisecond),
				hive.OneShot("flaky", func(ctx context.Context, h hive.Health) error {
					if attempts.Add(1) < 3 {
						return errors.New("not yet")
					}
					<-ctx.Done()
					return nil
				}, hive.WithRetry(-1, time.Millisecond, 5*time.Millisecond)),
				hive.OneShot("broken", func(context.Context, hive.Health) error { return errors.New("boom") }),
			)
		})),
		hivetest.Capture(&reporter),
	)
	_ = h
	waitFor(t, func() bool { return runs.Load() >= 3 && attempts.Load() >= 3 })
	waitFor(t, func() bool {
		for _, s := range reporter.Statuses() {
			if s.ID == "job-broken" && s.Level == hive.LevelDegraded && s.Error == "boom" && s.Module == "worker" {
				return true
			}
		}
		return false
	})
	mods := reporter.Modules()
	if len(mods) != 1 || mods[0].ID != "worker" || mods[0].Level != hive.LevelDegraded {
		t.Fatalf("module health: %+v", mods)
	}
}

type obj struct {
	Name  string
	Value int
}

func (o obj) TableHeader() []string { return []string{"Name", "Value"} }
func (o obj) TableRow() []string    { return []string{o.Name, fmt.Sprint(o.Value)} }

var objIndex = statedb.Index[obj, string]{
	Name:       "name",
	FromObject: func(o obj) index.KeySet { return index.NewKeySet(index.String(o.Name)) },
	FromKey:    index.String,
	Unique:     true,
}

func TestObserveTable(t *testing.T) {
	var (
		db    *statedb.DB
		table statedb.RWTable[obj]
		mu    sync.Mutex
		seen  []string
	)
	hivetest.Start(t, nil, hive.Module("observer", "Observer",
		hive.Provide(func(db *statedb.DB) (statedb.RWTable[obj], error) { return statedb.NewTable(db, "objs", objIndex) }),
		hive.Invoke(func(d *statedb.DB, tbl statedb.RWTable[obj], jobs hive.Jobs) {
			db, table = d, tbl
			jobs.Add(hive.ObserveTable("objs", d, statedb.Table[obj](tbl), func(_ context.Context, c statedb.Change[obj]) error {
				mu.Lock()
				defer mu.Unlock()
				seen = append(seen, fmt.Sprintf("%s=%d deleted=%t", c.Object.Name, c.Object.Value, c.Deleted))
				return nil
			}))
		}),
	))
	txn := db.WriteTxn(table)
	table.Insert(txn, obj{"a", 1})
	txn.Commit()
	txn = db.WriteTxn(table)
	table.Delete(txn, obj{"a", 1})
	txn.Commit()
	waitFor(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return strings.Join(seen, ";") == "a=1 deleted=false;a=1 deleted=true" || strings.Join(seen, ";") == "a=1 deleted=true"
	})
}

func TestPrintInfoAndDotGraph(t *testing.T) {
	type thing struct{}
	h := hivetest.New(t, []string{"--client-qps=3"},
		hive.Module("agent", "Agent",
			hive.Module("example", "Example things",
				hive.Config(defaultExample),
				hive.Provide(func(*slog.Logger, exampleConfig) *thing { return &thing{} }),
				hive.Invoke(func(lc hive.Lifecycle, _ *thing) {
					lc.Append(hive.Hook{Name: "example-start", OnStart: func(context.Context) error { return nil }})
				}),
			),
			hive.Feature("enable-extra", false, "extra things", hive.Module("extra", "Extra")),
		),
	)
	var buf bytes.Buffer
	if err := h.PrintInfo(&buf); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{
		"Cells:",
		"  Ⓜ️ agent (Agent):",
		"      Ⓜ️ example (Example things):",
		"⚙️ (hive_test.exampleConfig)",
		"--client-qps=3 (default 5)",
		"--mode=default (default default)",
		"⇨ *slog.Logger, hive_test.exampleConfig",
		"⇦ *hive_test.thing",
		"🛠️ hive_test.TestPrintInfoAndDotGraph.func",
		"🚩 --enable-extra=false (default false): disabled",
		"Start hooks:",
		"• example-start (agent.example)",
		"Stop hooks:",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("hive output lacks %q\n%s", want, out)
		}
	}
	dot, err := h.DotGraph()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(dot, "digraph {") || !strings.Contains(dot, "hive_test.thing") {
		t.Fatalf("unexpected dot graph:\n%s", dot)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(time.Millisecond)
	}
}
