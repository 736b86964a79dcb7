package nodesgc

import (
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/k8s/k8stest"
	"github.com/cellium/cellium/cells/kvstore"
)

// The collector is a leader job only with --kvstore and
// --synchronize-k8s-nodes (the default).
func TestLeaderJob(t *testing.T) {
	kv := kvstore.NewClient(hivetest.Logger(t), clientv3.Config{Endpoints: []string{"http://127.0.0.1:1"}}, time.Minute)
	for _, tc := range []struct {
		name   string
		kv     *kvstore.Client
		enable bool
		jobs   int
	}{
		{"no kvstore", nil, true, 0},
		{"disabled", kv, false, 0},
		{"enabled", kv, true, 1},
	} {
		cfg := DefaultConfig
		cfg.SynchronizeK8sNodes = tc.enable
		out := newLeaderJob(leaderJobParams{
			Config: cfg, Clientset: k8stest.NewClientset(), Log: hivetest.Logger(t),
			Health: &k8stest.HealthRecorder{}, KVStore: tc.kv,
		})
		if len(out.Jobs) != tc.jobs {
			t.Errorf("%s: %d leader jobs, want %d", tc.name, len(out.Jobs), tc.jobs)
		}
		if tc.jobs == 1 && out.Jobs[0].Name != "kvstore-nodes-gc" {
			t.Errorf("%s: job %q", tc.name, out.Jobs[0].Name)
		}
	}
}
