package cniconfig_test

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/cilium/statedb"
	"go.uber.org/goleak"

	"github.com/cellium/cellium/cells/agentapi"
	"github.com/cellium/cellium/cells/cniconfig"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/nodes"
	"github.com/cellium/cellium/statedb/routes"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const node = "cni-node"

// env is the cni-config cell with the tables it reads, owned by the test.
type env struct {
	db        *statedb.DB
	eps       statedb.RWTable[*endpoints.Endpoint]
	local     statedb.RWTable[*nodes.LocalNode]
	restored  func(statedb.WriteTxn)
	path      string
	socket    string
	h         *hive.Hive
	lastWrite statedb.Revision
}

func start(t *testing.T, args ...string) *env {
	t.Helper()
	dir := t.TempDir()
	e := &env{path: filepath.Join(dir, "net.d", "05-cellium.conflist"), socket: filepath.Join(dir, "api.sock")}
	e.h = hivetest.New(t, append([]string{"--write-cni-conf-when-ready=" + e.path, "--mtu=1400", "--socket-path=" + e.socket}, args...),
		hive.Config(agentapi.DefaultConfig),
		hive.Provide(
			func() k8s.NodeName { return node },
			endpoints.NewTable, statedb.RWTable[*endpoints.Endpoint].ToTable,
			nodes.NewLocalNodeTable, statedb.RWTable[*nodes.LocalNode].ToTable,
		),
		// Endpoint restore is pending until the test says otherwise.
		hive.Invoke(func(db *statedb.DB, eps statedb.RWTable[*endpoints.Endpoint]) {
			txn := db.WriteTxn(eps)
			e.restored = eps.RegisterInitializer(txn, "test-restore")
			txn.Commit()
		}),
		cniconfig.Cell,
		hivetest.Capture(&e.db), hivetest.Capture(&e.eps), hivetest.Capture(&e.local),
	)
	if err := e.h.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.h.Stop(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return e
}

func (e *env) setLocalNode(t *testing.T, router string) {
	t.Helper()
	n := &nodes.LocalNode{Name: node, InternalIP: netip.MustParseAddr("192.0.2.7")}
	if router != "" {
		n.RouterIP = netip.MustParseAddr(router)
	}
	txn := e.db.WriteTxn(e.local)
	if _, _, err := e.local.Insert(txn, n); err != nil {
		t.Fatal(err)
	}
	txn.Commit()
}

func (e *env) absent(t *testing.T, when string) {
	t.Helper()
	if _, err := os.Stat(e.path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("%s: conflist exists (or stat failed: %v); want it written only once the agent can serve pods", when, err)
	}
}

// waitFile waits for the conflist to appear; the writer's job writes it
// once, so its appearance is the event.
func (e *env) waitFile(t *testing.T) []byte {
	t.Helper()
	dir := filepath.Dir(e.path)
	deadline := time.Now().Add(20 * time.Second)
	for {
		if data, err := os.ReadFile(e.path); err == nil {
			return data
		}
		if time.Now().After(deadline) {
			entries, _ := os.ReadDir(dir)
			t.Fatalf("no conflist at %s after 20s (dir holds %v)", e.path, entries)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The conflist is written only when both endpoint restore is done and the
// local node has a router IP (IPAM has a pod CIDR), in either order, and
// says what the plugin needs: the agent socket and the MTU.
func TestConfListWrittenWhenReady(t *testing.T) {
	for _, order := range []string{"restore-first", "router-first"} {
		t.Run(order, func(t *testing.T) {
			e := start(t)
			e.absent(t, "at start")
			e.setLocalNode(t, "") // node known, no pod CIDR yet
			if order == "restore-first" {
				txn := e.db.WriteTxn(e.eps)
				e.restored(txn)
				txn.Commit()
				e.absent(t, "restored, no router IP")
				e.setLocalNode(t, "10.9.0.1")
			} else {
				e.setLocalNode(t, "10.9.0.1")
				e.absent(t, "router IP, endpoints not restored")
				txn := e.db.WriteTxn(e.eps)
				e.restored(txn)
				txn.Commit()
			}
			data := e.waitFile(t)
			var got struct {
				CNIVersion string `json:"cniVersion"`
				Name       string `json:"name"`
				Plugins    []struct {
					Type        string `json:"type"`
					AgentSocket string `json:"agent-socket"`
					MTU         int    `json:"mtu"`
				} `json:"plugins"`
			}
			if err := json.Unmarshal(data, &got); err != nil {
				t.Fatalf("conflist is not JSON: %v\n%s", err, data)
			}
			if got.CNIVersion != "1.1.0" || got.Name != "cellium" || len(got.Plugins) != 1 ||
				got.Plugins[0].Type != "cellium-cni" || got.Plugins[0].AgentSocket != e.socket || got.Plugins[0].MTU != 1400 {
				t.Fatalf("conflist:\n%s\nwant cellium-cni with socket %s and MTU 1400", data, e.socket)
			}
			if _, err := os.Stat(e.path + ".tmp"); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("temporary file left behind: %v", err)
			}
		})
	}
}

func TestMTUValidated(t *testing.T) {
	for _, mtu := range []int{575, 65536} {
		c := cniconfig.DefaultConfig
		c.MTU = mtu
		if err := c.Validate(); err == nil {
			t.Errorf("MTU %d accepted", mtu)
		}
	}
	if err := cniconfig.DefaultConfig.Validate(); err != nil {
		t.Error(err)
	}
}

// The conflist of each chaining mode, as Cilium writes it for the mode:
// cellium-cni alone, or cellium-cni then portmap with the portMappings
// capability (network "portmap"). Unknown modes are refused, naming the
// supported ones.
func TestConfListPerChainingMode(t *testing.T) {
	cellium := `{"type":"cellium-cni","agent-socket":"/run/c.sock","mtu":1450}`
	for mode, want := range map[string]string{
		"none":    `{"cniVersion":"1.1.0","name":"cellium","plugins":[` + cellium + `]}`,
		"portmap": `{"cniVersion":"1.1.0","name":"portmap","plugins":[` + cellium + `,{"type":"portmap","capabilities":{"portMappings":true}}]}`,
	} {
		got, err := cniconfig.ConfList("/run/c.sock", 1450, mode)
		if err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		var g, w any
		if err := json.Unmarshal(got, &g); err != nil {
			t.Fatalf("%s: conflist is not JSON: %v\n%s", mode, err, got)
		}
		if err := json.Unmarshal([]byte(want), &w); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(g, w) {
			t.Errorf("mode %s: conflist\n%s\nwant %s", mode, got, want)
		}
	}
	for _, mode := range []string{"", "flannel", "Portmap"} {
		if _, err := cniconfig.ConfList("/run/c.sock", 1450, mode); err == nil {
			t.Errorf("ConfList accepted mode %q", mode)
		}
		c := cniconfig.DefaultConfig
		c.CNIChainingMode = mode
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), "--cni-chaining-mode") || !strings.Contains(err.Error(), "none, portmap") {
			t.Errorf("Validate of mode %q: %v, want an error naming the flag and the supported modes", mode, err)
		}
	}
}

// --cni-chaining-mode=portmap makes the agent write the chained conflist.
func TestChainingModeFlagWritesPortmap(t *testing.T) {
	e := start(t, "--cni-chaining-mode=portmap")
	txn := e.db.WriteTxn(e.eps)
	e.restored(txn)
	txn.Commit()
	e.setLocalNode(t, "10.9.0.1")
	var got struct {
		Name    string `json:"name"`
		Plugins []struct {
			Type         string          `json:"type"`
			Capabilities map[string]bool `json:"capabilities"`
		} `json:"plugins"`
	}
	data := e.waitFile(t)
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatalf("conflist is not JSON: %v\n%s", err, data)
	}
	if got.Name != "portmap" || len(got.Plugins) != 2 || got.Plugins[0].Type != "cellium-cni" ||
		got.Plugins[1].Type != "portmap" || !got.Plugins[1].Capabilities["portMappings"] {
		t.Fatalf("conflist:\n%s\nwant cellium-cni then portmap with the portMappings capability", data)
	}
}

// --mtu=0 follows the tunnel device the host-routing cell desires
// (the uplink's MTU minus 50); without one it is 1500; a set --mtu wins.
func TestAutoMTU(t *testing.T) {
	db := statedb.New()
	devs, err := routes.NewDevicesTable(db)
	if err != nil {
		t.Fatal(err)
	}
	auto := cniconfig.AutoMTU{Config: cniconfig.DefaultConfig, DB: db, Devices: devs}
	if got := auto.PodMTU(); got != 1500 {
		t.Errorf("no tunnel device: MTU %d, want 1500", got)
	}
	wtxn := db.WriteTxn(devs)
	if _, _, err := devs.Insert(wtxn, &routes.Device{Name: routes.TunnelDevice, Kind: routes.KindVXLAN, Port: 8472, MTU: 1450}); err != nil {
		t.Fatal(err)
	}
	wtxn.Commit()
	if got := auto.PodMTU(); got != 1450 {
		t.Errorf("tunnel device of MTU 1450: pod MTU %d, want 1450", got)
	}
	auto.Config.MTU = 1400
	if got := auto.PodMTU(); got != 1400 {
		t.Errorf("--mtu=1400: pod MTU %d", got)
	}
	if got := (cniconfig.AutoMTU{Config: cniconfig.DefaultConfig}).PodMTU(); got != 1500 {
		t.Errorf("without host routing: %d, want 1500", got)
	}
}
