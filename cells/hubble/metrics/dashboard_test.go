package metrics_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"

	"github.com/cellium/cellium/test/harness"
)

// dashboardFile is the Grafana dashboard the chart ships, from this package.
const dashboardFile = "../../../install/helm/cellium/files/dashboards/hubble-dashboard.json"

// dashboardList is the --hubble-metrics the dashboard is written for (the
// chart's example): every metric, policy with pod contexts.
const dashboardList = "drop,tcp,flow,port-distribution,policy:sourceContext=pod;destinationContext=pod"

// grafanaVars are the dashboard's built-in Grafana variables, as Grafana
// would expand them for a short range scraped every second.
var grafanaVars = strings.NewReplacer(
	"$__rate_interval", "10s", "${__rate_interval}", "10s",
	"$__interval", "2s", "${__interval}", "2s",
	"$__range", "1m", "${__range}", "1m",
)

type panel struct {
	Type    string `json:"type"`
	Title   string `json:"title"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	Panels []panel `json:"panels"`
}

// dashboardQueries returns each panel's title and PromQL, rows' panels
// included; a panel without a query fails the test.
func dashboardQueries(t *testing.T) (titles, exprs []string) {
	t.Helper()
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		UID    string  `json:"uid"`
		Title  string  `json:"title"`
		Panels []panel `json:"panels"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	if d.UID == "" || d.Title == "" {
		t.Errorf("%s has no uid or title", dashboardFile)
	}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if p.Type == "row" {
				walk(p.Panels)
				continue
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, tg := range p.Targets {
				if strings.TrimSpace(tg.Expr) == "" {
					t.Errorf("panel %q has a target without expr", p.Title)
					continue
				}
				titles = append(titles, p.Title)
				exprs = append(exprs, tg.Expr)
			}
		}
	}
	walk(d.Panels)
	return titles, exprs
}

var leftoverVar = regexp.MustCompile(`\$\{?\w+`)

// Every panel of the Hubble dashboard, evaluated by a real Prometheus
// server scraping the cell's /metrics while realistic flows reach its sink,
// returns data.
func TestDashboardQueriesReturnData(t *testing.T) {
	prom, err := exec.LookPath("prometheus")
	if err != nil {
		if os.Getenv("CELLIUM_REQUIRE_PRIVILEGED") == "1" {
			t.Fatal("prometheus is not installed and CELLIUM_REQUIRE_PRIVILEGED=1: run `make deps` (Debian's prometheus package)")
		}
		t.Skip("prometheus is not installed: run `make deps` (Debian's prometheus package) to evaluate the dashboard's queries")
	}
	if testing.Short() {
		t.Skip("starts a Prometheus server for a few seconds; skipped with -short")
	}
	titles, exprs := dashboardQueries(t)
	if len(exprs) < 10 {
		t.Fatalf("the dashboard has %d queries; want the flows, drops, policy, TCP and port panels", len(exprs))
	}

	addr := freeAddr(t)
	sinks := startCell(t, "--hubble-metrics-server="+addr, "--hubble-metrics="+dashboardList)
	feedUntilDone(t, sinks[0].(interface {
		OnFlow(*flowpb.Flow)
		OnLost(*flowpb.LostEvent)
	}))

	api := startPrometheus(t, prom, addr)

	// The target is scraped.
	waitForData(t, api, `up{job="hubble"} == 1`, "the hubble target is up")
	for i, expr := range exprs {
		q := grafanaVars.Replace(expr)
		if v := leftoverVar.FindString(q); v != "" {
			t.Errorf("panel %q: %s uses the variable %s, which the test does not expand", titles[i], expr, v)
			continue
		}
		n := waitForData(t, api, q, "panel "+titles[i])
		t.Logf("panel %q: %s: %d series", titles[i], q, n)
	}
}

// feedUntilDone hands the conversation to the sink ten times a second, and
// a few lost events, until the test ends.
func feedUntilDone(t *testing.T, sink interface {
	OnFlow(*flowpb.Flow)
	OnLost(*flowpb.LostEvent)
}) {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			for _, f := range conversation {
				sink.OnFlow(f)
			}
			sink.OnLost(&flowpb.LostEvent{Source: flowpb.LostEventSource_PERF_EVENT_RING_BUFFER, NumEventsLost: 1})
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(func() {
		close(stop)
		wg.Wait()
	})
}

// startPrometheus runs prometheus on a free loopback port with its data in
// a temporary directory, scraping target every second as job "hubble", and
// returns its API's base URL. It is stopped when the test ends.
func startPrometheus(t *testing.T, bin, target string) string {
	t.Helper()
	dir := t.TempDir()
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: hubble
    static_configs:
      - targets: [%q]
`, target)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	listen := freeAddr(t)
	// The harness's runner: the server dies with the test binary too.
	run, err := harness.Process{
		Name: "prometheus",
		Path: bin,
		Args: []string{
			"--config.file=" + filepath.Join(dir, "prometheus.yml"),
			"--storage.tsdb.path=" + filepath.Join(dir, "data"),
			"--web.listen-address=" + listen,
			"--log.level=warn",
		},
		Dir:     dir,
		LogFile: filepath.Join(dir, "prometheus.log"),
	}.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := run.Stop(10 * time.Second); err != nil {
			t.Logf("stop prometheus: %v", err)
		}
		if t.Failed() {
			t.Logf("prometheus log:\n%s", run.LogTail(50))
		}
	})
	base := "http://" + listen
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case <-run.Done():
			t.Fatalf("prometheus exited: %v\n%s", run.Err(), run.LogTail(50))
		default:
		}
		resp, err := http.Get(base + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return base
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus not ready on %s after 30s:\n%s", listen, run.LogTail(50))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitForData evaluates query until it returns at least one series (within
// 60s) and returns how many. A query Prometheus refuses fails at once.
func waitForData(t *testing.T, api, query, what string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	last := ""
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, api+"/api/v1/query?query="+url.QueryEscape(query), nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			var r struct {
				Status    string `json:"status"`
				ErrorType string `json:"errorType"`
				Error     string `json:"error"`
				Data      struct {
					ResultType string            `json:"resultType"`
					Result     []json.RawMessage `json:"result"`
				} `json:"data"`
			}
			decErr := json.NewDecoder(resp.Body).Decode(&r)
			resp.Body.Close()
			switch {
			case decErr != nil:
				last = decErr.Error()
			case r.Status != "success":
				t.Fatalf("%s: Prometheus refuses %s: %s: %s", what, query, r.ErrorType, r.Error)
			case r.Data.ResultType != "vector":
				t.Fatalf("%s: %s gives a %s, want an instant vector", what, query, r.Data.ResultType)
			case len(r.Data.Result) > 0:
				return len(r.Data.Result)
			default:
				last = "empty result"
			}
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: %s returned no data within 60s (last: %s)", what, query, last)
		case <-time.After(500 * time.Millisecond):
		}
	}
}
