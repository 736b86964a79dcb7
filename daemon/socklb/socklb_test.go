package socklb_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/statedb"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/daemon/socklb"
	"github.com/cellium/cellium/datapath/bpfconfig"
	"github.com/cellium/cellium/datapath/maps"
	dpsocklb "github.com/cellium/cellium/datapath/socklb"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/lb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// k8sTables provides the two tables the cell reads (empty).
var k8sTables = hive.Group(
	hive.Provide(func(db *statedb.DB) (statedb.Table[*corev1.Service], error) {
		t, err := k8stables.NewServicesTable(db)
		return t, err
	}),
	hive.Provide(func(db *statedb.DB) (statedb.Table[*discoveryv1.EndpointSlice], error) {
		t, err := k8stables.NewEndpointSlicesTable(db)
		return t, err
	}),
)

// With --bpf-lb-sock=false the cell removes, at start, the link pins and
// map pins an earlier run left (which detaches the programs), and touches
// no cgroup; the tables are still readable (empty).
func TestOffRemovesPins(t *testing.T) {
	root := t.TempDir()
	cfg := bpfconfig.Config{BPFRoot: root}
	linkDir := filepath.Join(cfg.PinDir(), socklb.LinkSubdir)
	if err := os.MkdirAll(linkDir, 0o700); err != nil {
		t.Fatal(err)
	}
	var pins []string
	for _, p := range dpsocklb.Programs {
		pins = append(pins, filepath.Join(linkDir, p.Name))
	}
	for _, m := range []string{maps.LB4ServicesMapName, maps.LB4BackendsMapName, maps.LB4ReverseSKMapName,
		maps.LB4AffinityMapName, maps.LB4AffinityMatchMapName, maps.LB4SourceRangeMapName} {
		pins = append(pins, filepath.Join(cfg.PinDir(), m))
	}
	// Another map of the agent's stays.
	keep := filepath.Join(cfg.PinDir(), maps.IPCacheMapName)
	for _, p := range append(pins, keep) {
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var fe statedb.Table[*lb.Frontend]
	hivetest.Start(t, []string{"--bpf-lb-sock=false", "--cgroup-root=relative/is/fine/when/off"},
		hive.Provide(func() bpfconfig.Config { return cfg }), k8sTables, socklb.Cell, hivetest.Capture(&fe))
	for _, p := range pins {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s still there (%v)", p, err)
		}
	}
	if _, err := os.Stat(linkDir); !os.IsNotExist(err) {
		t.Errorf("link directory %s still there (%v)", linkDir, err)
	}
	if _, err := os.Stat(keep); err != nil {
		t.Errorf("%s removed: %v", keep, err)
	}
	if fe == nil || fe.Name() != lb.FrontendsTableName {
		t.Errorf("frontends table not provided: %v", fe)
	}
}

// On, --cgroup-root must be absolute.
func TestCgroupRootValidated(t *testing.T) {
	if err := (socklb.Config{EnableSocketLB: true, CgroupRoot: "run/x"}).Validate(); err == nil {
		t.Error("relative --cgroup-root accepted")
	}
	if err := socklb.DefaultConfig.Validate(); err != nil {
		t.Errorf("default config: %v", err)
	}
}

// --kube-proxy-replacement takes Cilium's "true" and "false" only, and
// "true" needs the socket load balancer.
func TestKubeProxyReplacementValidated(t *testing.T) {
	for _, tc := range []struct {
		kpr  string
		sock bool
		ok   bool
	}{
		{"false", true, true}, {"true", true, true}, {"false", false, true},
		{"true", false, false}, {"strict", true, false}, {"", true, false},
	} {
		c := socklb.DefaultConfig
		c.KubeProxyReplacement, c.EnableSocketLB = tc.kpr, tc.sock
		if err := c.Validate(); (err == nil) != tc.ok {
			t.Errorf("--kube-proxy-replacement=%q --bpf-lb-sock=%v: %v, want ok %v", tc.kpr, tc.sock, err, tc.ok)
		}
	}
	if socklb.DefaultConfig.KPR() {
		t.Error("kube-proxy replacement on by default (Cilium's default is false)")
	}
}
