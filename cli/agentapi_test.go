package cli

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cellium/cellium/cells/agentapi"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
)

// TestRealAgentAPI runs the commands against the agent's real API server
// (agentapi.Cell in a hive) with one module that reports itself degraded
// and none of the endpoint, identity, node or config handlers: status
// reads the real health reply, reports the missing sections as not
// served and exits 1; statedb lists and dumps real tables.
func TestRealAgentAPI(t *testing.T) {
	dir, err := os.MkdirTemp("", "cli")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "cellium.sock")
	reported := make(chan struct{})
	hivetest.Start(t, []string{"--socket-path=" + sock},
		agentapi.Cell,
		hive.Module("demo", "Reports itself degraded",
			hive.Invoke(func(jobs hive.Jobs) {
				jobs.Add(hive.OneShot("sync", func(ctx context.Context, h hive.Health) error {
					h.Degraded("sync with the API server", errors.New("connection refused"))
					close(reported)
					<-ctx.Done()
					return nil
				}))
			}),
		),
	)
	select {
	case <-reported:
	case <-time.After(10 * time.Second):
		t.Fatal("the demo job did not report")
	}

	r := run(t, sock, "status")
	if r.code != 1 {
		t.Errorf("status: exit %d, want 1 (degraded)", r.code)
	}
	for _, want := range []string{
		"Cellium:                 Degraded\n",
		"Endpoints:               unavailable: get endpoints: the agent does not serve GET /v1/endpoint: is it older than this cellium CLI?\n",
		// No prober in this agent.
		"Cluster health:          Probe disabled\n",
		"Modules Health:          Stopped(0) Degraded(1) OK(",
		"  demo ",
		"sync with the API server: connection refused\n",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("status output lacks %q:\n%s", want, r.stdout)
		}
	}
	if !strings.HasPrefix(r.stderr, "Error: the cellium agent is Degraded: demo: sync with the API server: connection refused") {
		t.Errorf("status stderr %q", r.stderr)
	}

	r = run(t, sock, "status", "-o", "json")
	var rep statusReport
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("status -o json: %v\n%s", err, r.stdout)
	}
	if rep.State != "Degraded" || rep.Endpoints != nil || rep.Unavailable["endpoints"] == "" {
		t.Errorf("status -o json: %+v", rep)
	}

	r = run(t, sock, "statedb")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "TABLE ") {
		t.Errorf("statedb: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	r = run(t, sock, "statedb", "nope")
	if r.code != 1 || !strings.HasPrefix(r.stderr, `Error: dump statedb table nope: the agent answered 404: no table "nope"`) {
		t.Errorf("statedb nope: exit %d, stderr %q", r.code, r.stderr)
	}
}
