package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/statedb"
	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cellium/cellium/api/client/clientset/versioned"
	"github.com/cellium/cellium/api/v1/client"
	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/identity"
	"github.com/cellium/cellium/daemon"
	"github.com/cellium/cellium/operator"
	"github.com/cellium/cellium/statedb/endpoints"
	identitytables "github.com/cellium/cellium/statedb/identity"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	statepolicy "github.com/cellium/cellium/statedb/policy"
	"github.com/cellium/cellium/test/controlplane"
	"github.com/cellium/cellium/test/harness"
)

// mode is one way of running cellium: where agents read other nodes'
// endpoints from (CiliumEndpoints or CiliumEndpointSlices) and where
// identities live (CiliumIdentity objects or etcd keys).
type mode struct {
	// slices is --enable-cilium-endpoint-slice, on both daemons.
	slices bool
	// identity is --identity-allocation-mode, on both daemons; kvstore
	// adds --kvstore=etcd with an etcd of the mode's own.
	identity string
}

// String names the mode as its subtests are named:
// mode=ces/identity=kvstore.
func (m mode) String() string {
	endpoints := "cep"
	if m.slices {
		endpoints = "ces"
	}
	return "mode=" + endpoints + "/identity=" + m.identity
}

// kvstore says whether identities are written to etcd (kvstore and the
// double-write modes).
func (m mode) kvstore() bool { return m.identity != identity.AllocationModeCRD }

// crd says whether identities are written as CiliumIdentity objects (crd
// and the double-write modes).
func (m mode) crd() bool { return m.identity != identity.AllocationModeKVStore }

// allModes is the matrix, {CEP, CES} × {CRD, kvstore}, and the two
// migration modes that write both identity backends and read one.
var allModes = []mode{
	{slices: false, identity: identity.AllocationModeCRD},
	{slices: false, identity: identity.AllocationModeKVStore},
	{slices: true, identity: identity.AllocationModeCRD},
	{slices: true, identity: identity.AllocationModeKVStore},
	{slices: false, identity: identity.AllocationModeDoubleWriteReadCRD},
	{slices: true, identity: identity.AllocationModeDoubleWriteReadKVStore},
}

// modesEnv selects the modes TestModes runs in (see testModes).
const modesEnv = "CELLIUM_TEST_MODES"

// defaultModes are the modes go test (and make test) runs: the defaults,
// everything switched, and a migration mode, which writes both backends.
// The six take 2.5 to 3 minutes on 2 cores, these three about half that.
var defaultModes = []mode{allModes[0], allModes[3], allModes[5]}

// testModes are the modes TestModes runs: defaultModes, all of allModes
// with CELLIUM_TEST_MODES=all (make test-modes), or with
// CELLIUM_TEST_MODES=<name>[,<name>...] only those
// (mode=ces/identity=kvstore,mode=cep/identity=crd).
func testModes(t *testing.T) []mode {
	sel := os.Getenv(modesEnv)
	switch sel {
	case "":
		return defaultModes
	case "all":
		return allModes
	}
	var out []mode
	for _, name := range strings.Split(sel, ",") {
		i := slices.IndexFunc(allModes, func(m mode) bool { return m.String() == strings.TrimSpace(name) })
		if i < 0 {
			t.Fatalf("%s=%q: no mode %q (want all, or names like %s)", modesEnv, sel, name, allModes[3])
		}
		out = append(out, allModes[i])
	}
	return out
}

// modeCluster is one mode's cellium on the shared API server: an
// operator and two agents (two nodes), each with its own least-privilege
// credentials from install/, and in kvstore mode an etcd of its own.
type modeCluster struct {
	mode
	c      *harness.Cluster
	ns     string
	admin  versioned.Interface
	etcd   *clientv3.Client // nil in CRD mode
	agents [2]*modeAgent
}

// modeAgent is one node's agent: its control plane (daemon.Agent, the
// cells cellium-agent runs) in this process, with the datapath's derivers
// and map reconcilers over in-memory maps (test/controlplane), so that
// nothing touches this machine's network.
type modeAgent struct {
	node string
	ip   string
	db   *statedb.DB
	pods statedb.Table[*corev1.Pod]
	api  *client.Client
	maps *controlplane.Maps
}

// startModeCluster starts m's operator and agents for nodes
// <prefix>-a and <prefix>-b. Everything stops when t ends.
func startModeCluster(t *testing.T, m mode, index int) *modeCluster {
	t.Helper()
	c := cluster.Get(t)
	ctx := t.Context()
	mc := &modeCluster{mode: m, c: c, ns: c.TestNamespace(t)}
	cfg := c.RESTConfig()
	cfg.QPS, cfg.Burst = 200, 200
	var err error
	if mc.admin, err = versioned.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}
	opKube, err := c.OperatorKubeconfig(ctx)
	if err != nil {
		t.Fatal(err)
	}
	agentKube, err := c.AgentKubeconfig(ctx)
	if err != nil {
		t.Fatal(err)
	}

	common := []string{
		"--enable-cilium-endpoint-slice=" + strconv.FormatBool(m.slices),
		"--identity-allocation-mode=" + m.identity,
	}
	if m.kvstore() {
		e := harness.StartEtcd(t)
		conf := filepath.Join(t.TempDir(), "etcd.config")
		if err := os.WriteFile(conf, []byte("endpoints:\n- "+e.URL()+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		common = append(common, "--kvstore=etcd", "--kvstore-opt=etcd.config="+conf)
		mc.etcd, err = clientv3.New(clientv3.Config{Endpoints: []string{e.URL()}, DialTimeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { mc.etcd.Close() })
	}

	// The operator: pod CIDRs for the nodes, slices in CES mode, CEP and
	// identity GC; leading at once.
	op := hivetest.New(t, append([]string{"--k8s-kubeconfig-path=" + opKube, "--leader-election=false",
		"--operator-api-serve-addr=", `--ces-rate-limits=[{"nodes":0,"limit":50,"burst":100}]`,
		// Identity GC within the test: a pass every 2s; a CiliumIdentity
		// is marked after 10s unused (longer than a new pod takes to get
		// its CEP), an etcd master key after two passes.
		"--identity-gc-interval=2s", "--identity-heartbeat-timeout=10s"}, common...),
		operator.Operator)
	start(t, op)

	// Two nodes, as kubelets would have registered them; the agents
	// publish their CiliumNodes, the operator gives them pod CIDRs.
	prefix := fmt.Sprintf("modes-%d", index)
	for i, suffix := range []string{"a", "b"} {
		a := &modeAgent{node: prefix + "-" + suffix, ip: fmt.Sprintf("192.168.56.%d", 100+10*index+i), maps: controlplane.NewMaps()}
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: a.node},
			Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: a.ip}}}}
		if _, err := c.Clientset().CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create node %s: %v", a.node, err)
		}
		t.Cleanup(func() {
			ctx := context.Background()
			_ = c.Clientset().CoreV1().Nodes().Delete(ctx, a.node, metav1.DeleteOptions{})
			_ = mc.admin.CiliumV2().CiliumNodes().Delete(ctx, a.node, metav1.DeleteOptions{})
		})
		// A unix socket path must stay short: not under t.TempDir().
		dir, err := os.MkdirTemp("", "cellium-modes")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		socket := filepath.Join(dir, "api.sock")
		// The node name comes from K8S_NODE_NAME, read when the hive starts.
		t.Setenv("K8S_NODE_NAME", a.node)
		h := hivetest.New(t, append([]string{"--k8s-kubeconfig-path=" + agentKube,
			"--socket-path=" + socket, "--state-dir=" + filepath.Join(dir, "state"),
			"--write-cni-conf-when-ready=", "--enable-hubble=false"}, common...),
			daemon.Agent, controlplane.Datapath(a.maps), hivetest.Capture(&a.db), hivetest.Capture(&a.pods))
		start(t, h)
		a.api = client.New(socket)
		t.Cleanup(a.api.Close)
		mc.agents[i] = a
	}
	// Both nodes have pod CIDRs: the agents can hand out addresses.
	for _, a := range mc.agents {
		eventually(t, time.Minute, a.node+"'s pod CIDR", func() error {
			cn, err := mc.admin.CiliumV2().CiliumNodes().Get(ctx, a.node, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if len(cn.Spec.IPAM.PodCIDRs) == 0 {
				return fmt.Errorf("no pod CIDR yet")
			}
			return nil
		})
	}
	return mc
}

// start starts h and stops it when t ends.
func start(t *testing.T, h *hive.Hive) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := h.Start(ctx); err != nil {
		t.Fatalf("start hive: %v", err)
	}
	t.Cleanup(func() {
		if err := h.Stop(context.Background()); err != nil {
			t.Errorf("stop hive: %v", err)
		}
	})
}

// podEndpoint is a pod with an endpoint, made as the CNI plugin makes it.
type podEndpoint struct {
	name string
	id   int64 // endpoint ID
	ip   string
	on   *modeAgent
}

// addPod creates pod name with labels on agent a's node and its endpoint
// through a's API, as the CNI plugin's ADD does.
func (mc *modeCluster) addPod(t *testing.T, a *modeAgent, name string, labels map[string]string) *podEndpoint {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	p := pod(name, a.node)
	p.Labels = labels
	if _, err := mc.c.Clientset().CoreV1().Pods(mc.ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s: %v", name, err)
	}
	cid := "c-" + name
	// The agent must see the pod before the CNI plugin asks for it.
	eventually(t, 30*time.Second, "pod "+name+" in "+a.node+"'s table", func() error {
		if _, _, ok := a.pods.Get(a.db.ReadTxn(), k8stables.NameIndex[*corev1.Pod]().Query(mc.ns+"/"+name)); !ok {
			return fmt.Errorf("not yet")
		}
		return nil
	})
	alloc, err := a.api.AllocateIP(ctx, mc.ns+"/"+name, cid)
	if err != nil {
		t.Fatalf("allocate an IP for %s on %s: %v", name, a.node, err)
	}
	// The agent bounds a create by endpointmanager.RegenerationWait and
	// then says what the endpoint waits for: give it the time to answer.
	putCtx, putCancel := context.WithTimeout(t.Context(), endpointmanager.RegenerationWait+30*time.Second)
	defer putCancel()
	ep, err := a.api.PutEndpoint(putCtx, &models.EndpointChangeRequest{
		ContainerID: cid, ContainerInterfaceName: "eth0",
		K8sNamespace: mc.ns, K8sPodName: name,
		InterfaceName: "lxc-" + name, InterfaceIndex: 100 + len(name),
		MAC: "0a:00:00:00:00:01", HostMAC: "0e:00:00:00:00:01",
		Addressing: models.AddressPair{IPV4: alloc.IPv4.IP}, SyncBuildEndpoint: true,
	})
	if err != nil {
		a.dump(t)
		t.Fatalf("create the endpoint of %s on %s: %v", name, a.node, err)
	}
	return &podEndpoint{name: name, id: ep.ID, ip: alloc.IPv4.IP, on: a}
}

// dump logs what agent a's endpoint creates wait for: its modules'
// health, which tables are initialized, and the rows of the endpoints,
// their identity requests and their policies. The agent's own log is in
// the test's log (hivetest.New).
func (a *modeAgent) dump(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if h, err := a.api.GetHealthz(ctx); err != nil {
		t.Logf("%s: healthz: %v", a.node, err)
	} else if b, err := json.MarshalIndent(h, "", "  "); err == nil {
		t.Logf("%s: healthz:\n%s", a.node, b)
	}
	var tables []models.TableInfo
	if err := a.api.Do(ctx, http.MethodGet, "/v1/statedb", nil, &tables); err != nil {
		t.Logf("%s: statedb tables: %v", a.node, err)
	}
	for _, ti := range tables {
		if !ti.Initialized {
			t.Logf("%s: table %s is not initialized (pending %v)", a.node, ti.Name, ti.Pending)
		}
	}
	for _, name := range []string{endpoints.TableName, identitytables.RequestsTable, statepolicy.TableName} {
		rows, err := a.api.GetStatedbTable(ctx, name)
		if err != nil {
			t.Logf("%s: table %s: %v", a.node, name, err)
			continue
		}
		t.Logf("%s: table %s: %s", a.node, name, rows)
	}
}

// deletePod deletes p's endpoint as the CNI plugin's DEL does, then the pod.
func (mc *modeCluster) deletePod(t *testing.T, p *podEndpoint) {
	t.Helper()
	ctx := t.Context()
	found, err := p.on.api.DeleteEndpointByContainerID(ctx, "c-"+p.name)
	if err != nil || !found {
		t.Fatalf("delete the endpoint of %s: found %v, %v", p.name, found, err)
	}
	if _, err := p.on.api.ReleaseContainerIP(ctx, p.ip, "c-"+p.name); err != nil {
		t.Fatalf("release %s: %v", p.ip, err)
	}
	if err := mc.c.Clientset().CoreV1().Pods(mc.ns).Delete(ctx, p.name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
}
