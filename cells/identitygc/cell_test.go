package identitygc

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cilium/statedb"
	clientv3 "go.etcd.io/etcd/client/v3"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/cells/k8s/k8stest"
	"github.com/cellium/cellium/cells/kvstore"
	"github.com/cellium/cellium/cells/leaderelection"
	k8stables "github.com/cellium/cellium/statedb/k8s"
)

func TestCellConfig(t *testing.T) {
	var cfg Config
	if err := hivetest.New(t, nil, Cell, hivetest.Capture(&cfg)).Populate(); err != nil {
		t.Fatal(err)
	}
	if cfg != DefaultConfig || cfg.IdentityGCInterval != 15*time.Minute || cfg.IdentityHeartbeatTimeout != 30*time.Minute {
		t.Errorf("defaults %+v, want 15m interval and 30m heartbeat timeout", cfg)
	}
	for _, arg := range []string{
		"--identity-gc-interval=0", "--identity-heartbeat-timeout=-1s",
		"--identity-gc-rate-interval=0", "--identity-gc-rate-limit=0",
	} {
		err := hivetest.New(t, []string{arg}, Cell).Populate()
		flag, _, _ := strings.Cut(arg, "=")
		if err == nil || !strings.Contains(err.Error(), flag) {
			t.Errorf("%s: err = %v, want one naming %s", arg, err, flag)
		}
	}
}

// TestCellAsLeaderJob runs the cell under the real leader election
// (disabled: this replica leads at once), with tables from the hive: the
// identities mirrored from the fake API, the CiliumEndpoints fed here.
func TestCellAsLeaderJob(t *testing.T) {
	e := &env{t: t, cs: k8stest.NewClientset(), health: &k8stest.HealthRecorder{}}
	h := hivetest.New(t, []string{
		"--leader-election=false", "--identity-gc-interval=20ms", "--identity-heartbeat-timeout=100ms",
	},
		hive.Provide(
			func() k8s.Clientset { return e.cs },
			k8stables.NewCiliumIdentitiesTable, statedb.RWTable[*ciliumv2.CiliumIdentity].ToTable,
			k8stables.NewCiliumEndpointsTable, statedb.RWTable[*ciliumv2.CiliumEndpoint].ToTable,
		),
		leaderelection.Cell, Cell,
		hivetest.Capture(&e.db), hivetest.Capture(&e.cids), hivetest.Capture(&e.ceps),
	)
	if err := h.Populate(); err != nil {
		t.Fatal(err)
	}
	e.identity("1000")
	e.identity("1001")
	e.use("web", 1001)
	api := e.cs.Cilium().CiliumV2().CiliumIdentities()
	k8stest.Mirror(t, e.db, e.cids, api, k8stest.Closed())
	if err := h.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := h.Stop(context.Background()); err != nil {
			t.Error(err)
		}
	})
	k8stest.Eventually(t, "the unused identity deleted", func() error {
		if got := e.api(); fmt.Sprint(got) != "map[1001:false]" {
			return fmt.Errorf("identities %v", got)
		}
		return nil
	})
}

// TestLeaderJobsByMode: the CRD collector in crd mode, the kvstore one in
// kvstore mode, both in the double-write modes (as Cilium's operator
// does); a mode that writes etcd without --kvstore stops the operator.
func TestLeaderJobsByMode(t *testing.T) {
	kv := kvstore.NewClient(hivetest.Discard(), clientv3.Config{Endpoints: []string{"http://127.0.0.1:1"}}, time.Minute)
	for mode, want := range map[string]string{
		"crd":                     "[crd-identity-gc]",
		"kvstore":                 "[kvstore-identity-gc]",
		"doublewrite-readcrd":     "[kvstore-identity-gc crd-identity-gc]",
		"doublewrite-readkvstore": "[kvstore-identity-gc crd-identity-gc]",
	} {
		cfg := DefaultConfig
		cfg.IdentityAllocationMode = mode
		if err := cfg.Validate(); err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		p := leaderJobParams{Config: cfg, Clientset: k8stest.NewClientset(), DB: statedb.New(),
			Log: hivetest.Discard(), Health: &k8stest.HealthRecorder{}, KVStore: kv}
		out, err := newLeaderJob(p)
		if err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		var names []string
		for _, j := range out.Jobs {
			names = append(names, j.Name)
		}
		if got := fmt.Sprint(names); got != want {
			t.Errorf("%s: jobs %s, want %s", mode, got, want)
		}
		if mode != "crd" {
			p.KVStore = nil
			if _, err := newLeaderJob(p); err == nil || !strings.Contains(err.Error(), "--kvstore=etcd") {
				t.Errorf("%s without --kvstore: err = %v, want one naming --kvstore=etcd", mode, err)
			}
		}
	}
}
