package clusterpool_test

import (
	"context"
	"strings"
	"testing"

	"github.com/cilium/statedb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/clusterpool"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/cells/k8s/k8stest"
	"github.com/cellium/cellium/cells/leaderelection"
	k8stables "github.com/cellium/cellium/statedb/k8s"
)

// TestCellFlagsValidated checks that bad flag values stop start-up with an
// error naming the flag.
func TestCellFlagsValidated(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--cluster-pool-ipv4-cidr=10.0.0.1/16"}, "--cluster-pool-ipv4-cidr: 10.0.0.1/16 has host bits set"},
		{[]string{"--cluster-pool-ipv4-cidr=fd00::/104"}, "--cluster-pool-ipv4-cidr: fd00::/104 is not an IPv4 CIDR"},
		{[]string{"--cluster-pool-ipv4-cidr=10.0.0.0/16", "--cluster-pool-ipv4-mask-size=8"}, "--cluster-pool-ipv4-mask-size=8"},
		{[]string{"--cluster-pool-ipv4-cidr="}, "--cluster-pool-ipv4-cidr: no CIDR given"},
	} {
		h := hivetest.New(t, tc.args, clusterpool.Cell)
		err := h.Populate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err = %v, want it to contain %q", tc.args, err, tc.want)
		}
	}
}

// TestCellDefaults checks Cilium's defaults.
func TestCellDefaults(t *testing.T) {
	var cfg clusterpool.Config
	h := hivetest.New(t, nil, clusterpool.Cell, hivetest.Capture(&cfg))
	if err := h.Populate(); err != nil {
		t.Fatal(err)
	}
	if len(cfg.ClusterPoolIPv4CIDR) != 1 || cfg.ClusterPoolIPv4CIDR[0] != "10.0.0.0/8" || cfg.ClusterPoolIPv4MaskSize != 24 {
		t.Fatalf("defaults = %+v, want [10.0.0.0/8] /24", cfg)
	}
}

// TestCellAsLeaderJob runs the cell in a partial hive with the real
// leader election (disabled, so this replica leads at once), a fake
// clientset and a CiliumNodes table mirrored from it.
func TestCellAsLeaderJob(t *testing.T) {
	cs := k8stest.NewClientset()
	var (
		db    *statedb.DB
		table statedb.RWTable[*ciliumv2.CiliumNode]
	)
	h := hivetest.New(t, []string{"--leader-election=false", "--cluster-pool-ipv4-cidr=10.20.0.0/16", "--cluster-pool-ipv4-mask-size=26"},
		hive.Provide(
			func() k8s.Clientset { return cs },
			k8stables.NewCiliumNodesTable,
			statedb.RWTable[*ciliumv2.CiliumNode].ToTable,
		),
		leaderelection.Cell,
		clusterpool.Cell,
		hivetest.Capture(&db), hivetest.Capture(&table),
	)
	if err := h.Populate(); err != nil {
		t.Fatal(err)
	}
	api := cs.Cilium().CiliumV2().CiliumNodes()
	if _, err := api.Create(context.Background(), node("node-a"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	k8stest.Mirror(t, db, table, api, k8stest.Closed())
	if err := h.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := h.Stop(context.Background()); err != nil {
			t.Error(err)
		}
	})
	e := &env{t: t, cs: cs}
	e.waitCIDRs("node-a", "10.20.0.0/26")
	e.create(node("node-b"))
	e.waitCIDRs("node-b", "10.20.0.64/26")
}
