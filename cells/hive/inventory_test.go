package hive_test

import (
	"context"
	"strings"
	"testing"

	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
)

// The inventory names each module's tables as writer or reader, lists
// described jobs with their detail and leaves out switched-off features.
func TestInventory(t *testing.T) {
	h := hivetest.New(t, []string{"--enable-extra=false"},
		hive.Module("owner", "Owns the objs table",
			hive.Provide(func(db *statedb.DB) (statedb.RWTable[obj], error) { return statedb.NewTable(db, "objs", objIndex) }),
			hive.Provide(func(t statedb.RWTable[obj]) statedb.Table[obj] { return t }),
			hive.Invoke(func(jobs hive.Jobs) {
				jobs.Add(hive.DescribeJob(hive.Service("reconcile-objs", nil, func(context.Context, hive.Health) {}), "objs → somewhere"))
			}),
		),
		hive.Module("watcher", "Reads the objs table",
			hive.Module("inner", "Nested reader",
				hive.Invoke(func(statedb.Table[obj]) {}),
			),
		),
		hive.Feature("enable-extra", true, "extra cells",
			hive.Module("extra", "Switched off",
				hive.Invoke(func(statedb.RWTable[obj]) {}),
			),
		),
	)
	inv, err := h.Inventory()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range inv.Modules {
		ids = append(ids, m.ID)
	}
	if got, want := strings.Join(ids, " "), "owner watcher watcher.inner"; got != want {
		t.Errorf("modules %q, want %q", got, want)
	}
	tables := inv.Tables()
	if len(tables) != 1 || tables[0].Row != "hive_test.obj" ||
		strings.Join(tables[0].Writers, ",") != "owner" || strings.Join(tables[0].Readers, ",") != "watcher.inner" {
		t.Errorf("tables %+v, want hive_test.obj written by owner, read by watcher.inner", tables)
	}
	md := inv.Markdown("example")
	for _, want := range []string{
		"- `owner`: Owns the objs table\n",
		"  - `inner`: Nested reader\n",
		"| `hive_test.obj` | `owner` | `watcher.inner` |\n",
		"| `objs` | `owner` | objs → somewhere |\n",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "extra") {
		t.Errorf("markdown lists the switched-off feature's module:\n%s", md)
	}
}
