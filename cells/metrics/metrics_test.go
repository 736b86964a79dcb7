package metrics_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	"go.uber.org/goleak"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/metrics"
	"github.com/cellium/cellium/statedb/reconciler"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type row string

func (row) TableHeader() []string { return []string{"Row"} }
func (r row) TableRow() []string  { return []string{string(r)} }

var rowIndex = statedb.Index[row, string]{
	Name:       "id",
	FromObject: func(r row) index.KeySet { return index.NewKeySet(index.String(string(r))) },
	FromKey:    index.String,
	FromString: index.FromString,
	Unique:     true,
}

// freeAddr is a loopback address with a port nobody listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func scrape(t *testing.T, addr string) string {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s\n%s", resp.Status, body)
	}
	return string(body)
}

// /metrics is served on --prometheus-serve-addr with the documented names:
// reconciler operations and errors, table sizes, module health, hook
// durations, and the Go and process collectors.
func TestMetricsServedWithNames(t *testing.T) {
	addr := freeAddr(t)
	var rm reconciler.Metrics
	reported := make(chan struct{})
	hivetest.Start(t, []string{"--prometheus-serve-addr=" + addr},
		metrics.Cell,
		hive.Module("test-module", "Test",
			hive.Invoke(func(db *statedb.DB, lc hive.Lifecycle, jobs hive.Jobs) error {
				tbl, err := statedb.NewTable(db, "test-rows", rowIndex)
				if err != nil {
					return err
				}
				txn := db.WriteTxn(tbl)
				_, _, _ = tbl.Insert(txn, row("a"))
				_, _, _ = tbl.Insert(txn, row("b"))
				txn.Commit()
				jobs.Add(hive.Service("ok-job", nil, func(ctx context.Context, h hive.Health) {
					h.OK("fine")
					close(reported)
					<-ctx.Done()
				}))
				return nil
			}),
		),
		hivetest.Capture(&rm),
	)
	rm.Operation("test-reconciler", "update", time.Millisecond, nil)
	rm.Operation("test-reconciler", "update", time.Millisecond, errors.New("boom"))
	rm.Errors("test-reconciler", 1)
	<-reported

	out := scrape(t, addr)
	for _, want := range []string{
		`cellium_reconciler_operations_total{op="update",outcome="success",reconciler="test-reconciler"} 1`,
		`cellium_reconciler_operations_total{op="update",outcome="error",reconciler="test-reconciler"} 1`,
		`cellium_reconciler_operation_duration_seconds_count{op="update",reconciler="test-reconciler"} 2`,
		`cellium_reconciler_errors_current{reconciler="test-reconciler"} 1`,
		`cellium_statedb_table_objects{table="test-rows"} 2`,
		`cellium_module_health{level="ok",module="test-module"} 1`,
		`cellium_hive_hook_duration_seconds{hook="metrics`,
		"go_goroutines ",
		"process_start_time_seconds ",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", out)
	}
}

// An address that cannot be listened on fails the start, naming the flag.
func TestBadAddressNamesFlag(t *testing.T) {
	h := hivetest.New(t, []string{"--prometheus-serve-addr=256.0.0.1:1"}, metrics.Cell)
	err := h.Start(t.Context())
	if err == nil {
		_ = h.Stop(t.Context())
		t.Fatal("started with an invalid address")
	}
	if !strings.Contains(err.Error(), "--prometheus-serve-addr=256.0.0.1:1") {
		t.Fatalf("err = %v, want it to name the flag", err)
	}
}
