package endpointgc_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/endpointgc"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/cells/k8s/k8stest"
	"github.com/cellium/cellium/cells/leaderelection"
	k8stables "github.com/cellium/cellium/statedb/k8s"
)

// cellEnv composes a hive of cells with the fake clientset and the
// tables the k8s cells would provide; the test feeds the tables through
// the returned env. The hive is populated, not started.
func cellEnv(t *testing.T, args []string, cells ...hive.Cell) (*env, *hive.Hive) {
	t.Helper()
	e := &env{t: t, cs: k8stest.NewClientset(), health: &k8stest.HealthRecorder{}}
	cells = append(cells,
		hive.Provide(
			func() k8s.Clientset { return e.cs },
			k8stables.NewPodsTable, statedb.RWTable[*corev1.Pod].ToTable,
			k8stables.NewCiliumEndpointsTable, statedb.RWTable[*ciliumv2.CiliumEndpoint].ToTable,
			k8stables.NewCiliumNodesTable, statedb.RWTable[*ciliumv2.CiliumNode].ToTable,
		),
		hivetest.Capture(&e.db), hivetest.Capture(&e.pods), hivetest.Capture(&e.ceps), hivetest.Capture(&e.nodes),
	)
	h := hivetest.New(t, args, cells...)
	if err := h.Populate(); err != nil {
		t.Fatal(err)
	}
	return e, h
}

// leaderJobs captures the leader jobs contributed to the hive.
type leaderJobs struct {
	hive.In
	Jobs []leaderelection.LeaderJob `group:"leader-jobs"`
}

func TestCellConfig(t *testing.T) {
	var cfg endpointgc.Config
	if err := hivetest.New(t, nil, endpointgc.Cell, hivetest.Capture(&cfg)).Populate(); err != nil {
		t.Fatal(err)
	}
	if cfg.CiliumEndpointGCInterval != 5*time.Minute {
		t.Errorf("default interval %s, want 5m0s", cfg.CiliumEndpointGCInterval)
	}
	err := hivetest.New(t, []string{"--cilium-endpoint-gc-interval=-1s"}, endpointgc.Cell).Populate()
	if err == nil || !strings.Contains(err.Error(), "--cilium-endpoint-gc-interval") {
		t.Errorf("negative interval: err = %v, want one naming the flag", err)
	}
}

func TestCellIntervalZeroDisables(t *testing.T) {
	var jobs leaderJobs
	cellEnv(t, []string{"--cilium-endpoint-gc-interval=0"}, endpointgc.Cell, hivetest.Capture(&jobs))
	if len(jobs.Jobs) != 0 {
		t.Errorf("leader jobs %v, want none with interval 0", jobs.Jobs)
	}
}

// TestCellAsLeaderJob runs the cell under the real leader election
// (disabled: this replica leads at once).
func TestCellAsLeaderJob(t *testing.T) {
	e, h := cellEnv(t, []string{"--leader-election=false", "--cilium-endpoint-gc-interval=50ms"},
		leaderelection.Cell, endpointgc.Cell)
	e.pod("live", "uid-live", corev1.PodRunning)
	e.cep("default", "live", "uid-live", time.Hour)
	e.cep("default", "gone", "uid-gone", time.Hour)
	if err := h.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := h.Stop(context.Background()); err != nil {
			t.Error(err)
		}
	})
	k8stest.Eventually(t, "the stale CiliumEndpoint deleted", func() error {
		if got := e.remaining(); len(got) != 1 || got[0] != "default/live" {
			return errRemaining(got)
		}
		return nil
	})
}

type errRemaining []string

func (e errRemaining) Error() string { return "remaining " + strings.Join(e, ", ") }
