package scale

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/client/clientset/versioned"
	"github.com/cellium/cellium/api/v1/client"
	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/cells/cesbatcher"
	"github.com/cellium/cellium/install"
	"github.com/cellium/cellium/statedb/ipcache"
	"github.com/cellium/cellium/test/harness"
)

// Result is what one simulation measured.
type Result struct {
	Config Config
	// Setup is how long creating the objects took, Converged how long
	// after that the agent's ipcache held every remote pod.
	Setup, Converged time.Duration
	// The agent's Go heap in use (the least of 10 samples over 5 s, close
	// to the live heap) and resident set, before any remote object and
	// with all of them.
	HeapBefore, HeapAfter, RSSBefore, RSSAfter float64
	// LiveBefore and LiveAfter are the agent's live heap: its allocated
	// heap bytes just after the full GC that starts each memory sample.
	LiveBefore, LiveAfter float64
	// Changes is the number of remote endpoint changes of the churn phase
	// (at most two per pod: no pod is replaced twice), ChurnWindow how
	// long it lasted (until the sampled pods were in the ipcache), ChurnCPU the agent's CPU seconds in it and IdleCPU its CPU
	// seconds per second before it.
	Changes     int
	ChurnWindow time.Duration
	ChurnCPU    float64
	IdleCPU     float64
	// IPCache is the CEP-to-ipcache latency of the sampled new pods.
	IPCache Latencies
	// IPCacheMissed is how many samples the ipcache did not show within
	// 2 minutes after the churn.
	IPCacheMissed int
	// Policy is the policy-change-to-desired-map-state latency.
	Policy Latencies
	// PolicyIdentities is how many identities the measured policy selects.
	PolicyIdentities int
	// WatchEvents are the API server's watch events sent in the churn
	// window (cellium's agent and operator are the only watchers), by
	// resource kind.
	WatchEvents map[string]float64
	// Writes are cellium's writes (agent and operator ServiceAccounts,
	// from the audit log) in the churn window, by "who resource verb".
	Writes map[string]int
	// KVStoreKeys and KVStoreBytes are the keys under cilium/ in etcd
	// (kvstore mode) and their keys' and values' bytes, at the end.
	KVStoreKeys, KVStoreBytes int64
	// EtcdDBSize and EtcdDBInUse are etcd's database size and the part in
	// use, at the end.
	EtcdDBSize, EtcdDBInUse float64
}

// RemoteEndpoints is the number of remote endpoints the agent holds.
func (r *Result) RemoteEndpoints() int { return r.Config.Pods }

// HeapPerEndpoint is the agent's heap growth per remote endpoint, in
// bytes.
func (r *Result) HeapPerEndpoint() float64 {
	return (r.HeapAfter - r.HeapBefore) / float64(r.RemoteEndpoints())
}

// LivePerEndpoint is the agent's live heap growth per remote endpoint,
// in bytes: HeapPerEndpoint without the free space in the spans in use.
func (r *Result) LivePerEndpoint() float64 {
	return (r.LiveAfter - r.LiveBefore) / float64(r.RemoteEndpoints())
}

// RSSPerEndpoint is the agent's resident set growth per remote
// endpoint, in bytes.
func (r *Result) RSSPerEndpoint() float64 {
	return (r.RSSAfter - r.RSSBefore) / float64(r.RemoteEndpoints())
}

// CPUPer1000 is the agent's CPU seconds per 1,000 remote endpoint
// changes, its idle rate over the window subtracted.
func (r *Result) CPUPer1000() float64 {
	if r.Changes == 0 {
		return 0
	}
	return max(0, r.ChurnCPU-r.IdleCPU*r.ChurnWindow.Seconds()) / float64(r.Changes) * 1000
}

// WatchEventsPerChange is the watch events sent to cellium per remote
// endpoint change of the churn window.
func (r *Result) WatchEventsPerChange() float64 {
	if r.Changes == 0 {
		return 0
	}
	return r.WatchEventsPerSecond() * r.ChurnWindow.Seconds() / float64(r.Changes)
}

// WatchEventsPerSecond is the watch events sent to cellium per second of
// the churn window.
func (r *Result) WatchEventsPerSecond() float64 {
	var n float64
	for _, v := range r.WatchEvents {
		n += v
	}
	return n / r.ChurnWindow.Seconds()
}

// WritesPerSecond is cellium's writes per second of the churn window.
func (r *Result) WritesPerSecond() float64 {
	n := 0
	for _, v := range r.Writes {
		n += v
	}
	return float64(n) / r.ChurnWindow.Seconds()
}

// Latencies summarises latency samples.
type Latencies struct {
	N             int
	P50, P99, Max time.Duration
}

func summarise(d []time.Duration) Latencies {
	if len(d) == 0 {
		return Latencies{}
	}
	slices.Sort(d)
	at := func(q float64) time.Duration { return d[min(len(d)-1, int(q*float64(len(d))))] }
	return Latencies{N: len(d), P50: at(0.50), P99: at(0.99), Max: d[len(d)-1]}
}

// auditPolicy logs the writes of cellium's ServiceAccounts, nothing else
// (the simulation's own writes, as the admin, are not logged).
var auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  users: ["` + agentUser + `", "` + operatorUser + `"]
  verbs: ["create", "update", "patch", "delete", "deletecollection"]
- level: None
`

var (
	agentUser    = "system:serviceaccount:" + install.Namespace + ":" + install.AgentServiceAccount
	operatorUser = "system:serviceaccount:" + install.Namespace + ":" + install.OperatorServiceAccount
)

// agentNode is the agent's own node.
const agentNode = "scale-agent"

// runner is one simulation in progress.
type runner struct {
	cfg     Config
	c       *harness.Cluster
	kube    kubernetes.Interface
	cilium  versioned.Interface
	admin   *http.Client // to the API server as the admin
	dir     string
	procs   []*harness.Running
	api     *client.Client
	metrics string           // the agent's /metrics URL
	pprof   string           // the agent's pprof server (--pprof)
	etcd    *clientv3.Client // in kvstore mode
	// leases are the simulated nodes' session leases (kvstore mode),
	// by node.
	leases  []clientv3.LeaseID
	scraper *http.Client

	pool  *addressPool
	pods  []remotePod
	names atomic.Int64
}

// Run runs one simulation and returns its figures. ctx bounds it all.
func Run(ctx context.Context, cfg Config) (res *Result, err error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	// The scrapes ask for no gzip: promhttp would otherwise keep a
	// gzip writer of about 800 KiB per concurrent scrape in a pool in the
	// agent's heap, which the memory samples would count at random.
	r := &runner{cfg: cfg, scraper: &http.Client{Timeout: 10 * time.Second,
		Transport: &http.Transport{DisableCompression: true}}}
	// The watch streams end with ctx: cancelled before the agent is
	// stopped, so that its API server need not wait for them.
	ctx, cancel := context.WithCancel(ctx)
	defer func() {
		cancel()
		if stopErr := r.stop(err != nil); err == nil {
			err = stopErr
		}
	}()
	return r.run(ctx)
}

func (r *runner) log(msg string, args ...any) { r.cfg.Log.Info(msg, args...) }

func (r *runner) run(ctx context.Context) (*Result, error) {
	res := &Result{Config: r.cfg}
	if err := r.start(ctx); err != nil {
		return nil, err
	}
	localEP, err := r.localEndpoint(ctx)
	if err != nil {
		return nil, err
	}
	pw, err := watchPolicy(ctx, r.api, localEP)
	if err != nil {
		return nil, err
	}
	// The agent idle, with its own node and pod only.
	r.log("measuring the agent before the remote objects")
	time.Sleep(3 * time.Second)
	if res.HeapBefore, res.RSSBefore, res.LiveBefore, err = r.memory(ctx); err != nil {
		return nil, err
	}
	if r.cfg.HeapProfile != "" {
		// The base to subtract: go tool pprof -diff_base.
		ext := filepath.Ext(r.cfg.HeapProfile)
		if err := r.saveHeapProfile(ctx, strings.TrimSuffix(r.cfg.HeapProfile, ext)+"-before"+ext); err != nil {
			return nil, err
		}
	}
	iw, err := watchIPCache(ctx, r.api, r.ipcacheSource())
	if err != nil {
		return nil, err
	}

	t0 := time.Now()
	if err := r.populate(ctx); err != nil {
		return nil, err
	}
	res.Setup = time.Since(t0)
	r.log("objects created", "took", res.Setup.Round(time.Millisecond))
	t1 := time.Now()
	// In CES mode the operator writes 10 slices a second below 100
	// CiliumNodes (the chart's first step), several times each while
	// their pods arrive: allow 30 ms a pod.
	if err := r.waitIPCache(ctx, iw, r.pods, 2*time.Minute+time.Duration(r.cfg.Pods)*30*time.Millisecond); err != nil {
		return nil, err
	}
	res.Converged = time.Since(t1)
	r.log("the agent's ipcache holds every remote pod", "after", res.Converged.Round(time.Millisecond))

	// Let the agent settle (slices batched, derived tables done).
	time.Sleep(5 * time.Second)
	if res.HeapAfter, res.RSSAfter, res.LiveAfter, err = r.memory(ctx); err != nil {
		return nil, err
	}
	r.log("memory", "heap per remote endpoint", res.HeapPerEndpoint(), "live heap per remote endpoint", res.LivePerEndpoint(),
		"rss per remote endpoint", res.RSSPerEndpoint())
	if r.cfg.HeapProfile != "" {
		if err := r.saveHeapProfile(ctx, r.cfg.HeapProfile); err != nil {
			return nil, err
		}
		r.log("heap profile saved", "file", r.cfg.HeapProfile)
	}

	if err := r.churn(ctx, res, iw); err != nil {
		return nil, err
	}
	if err := r.policyChanges(ctx, res, pw); err != nil {
		return nil, err
	}
	etcd, err := scrape(ctx, r.scraper, r.c.EtcdURL()+"/metrics")
	if err != nil {
		return nil, err
	}
	res.EtcdDBSize = etcd.get("etcd_mvcc_db_total_size_in_bytes")
	res.EtcdDBInUse = etcd.get("etcd_mvcc_db_total_size_in_use_in_bytes")
	if r.etcd != nil {
		if res.KVStoreKeys, res.KVStoreBytes, err = r.kvstoreSize(ctx); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// start starts the cluster, builds (if needed) and starts the operator
// and the agent, and waits until the agent can allocate addresses.
func (r *runner) start(ctx context.Context) error {
	r.log("starting etcd and kube-apiserver")
	c, err := harness.Start(ctx, harness.Options{
		AuditPolicy: auditPolicy,
		KeepDir:     r.cfg.KeepDir,
		// The simulation writes tens of thousands of objects as fast as
		// the API server takes them.
		APIServerArgs: []string{"--max-requests-inflight=2000", "--max-mutating-requests-inflight=1000"},
		Logger:        r.cfg.Log,
	})
	if err != nil {
		return err
	}
	r.c, r.dir = c, c.Dir()
	cfg := c.RESTConfig()
	cfg.QPS, cfg.Burst = -1, 0 // no client-side rate limit
	if r.kube, err = kubernetes.NewForConfig(cfg); err != nil {
		return err
	}
	if r.cilium, err = versioned.NewForConfig(cfg); err != nil {
		return err
	}
	bin := r.cfg.BinDir
	if bin == "" {
		bin = filepath.Join(r.dir, "bin")
		r.log("building cellium-agent and cellium-operator")
		if err := harness.BuildCellium(ctx, bin); err != nil {
			return err
		}
	}
	opKube, err := c.OperatorKubeconfig(ctx)
	if err != nil {
		return err
	}
	agentKube, err := c.AgentKubeconfig(ctx)
	if err != nil {
		return err
	}
	sliceArg := fmt.Sprintf("--enable-cilium-endpoint-slice=%t", r.cfg.Mode == ModeCES)
	var cesArgs []string
	if r.cfg.Mode == ModeCES && !r.cfg.operatorSetsCESRate() {
		// What a Helm install runs: the chart's default
		// ciliumEndpointSlice.rateLimits (10 writes a second and bursts
		// of 20 below 100 CiliumNodes, 50 and 100 from 100 on), not the
		// flag's default (10 and 20 at any size). A rate given with
		// -operator-arg replaces it.
		cesArgs = []string{"--" + cesbatcher.FlagRateLimits + "=" + cesbatcher.ChartRateLimits}
	}
	var kvArgs []string
	if r.cfg.Mode == ModeKVStore {
		// Both on the harness's etcd (the API server's too; the
		// kvstore's keys are under cilium/).
		kvArgs = []string{"--identity-allocation-mode=kvstore", "--kvstore=etcd", "--kvstore-opt=etcd.address=" + c.EtcdURL()}
		if r.etcd, err = clientv3.New(clientv3.Config{Endpoints: []string{c.EtcdURL()}, DialTimeout: 10 * time.Second,
			Logger: zap.NewNop()}); err != nil {
			return fmt.Errorf("etcd client: %w", err)
		}
	}
	opAddr, err := freeAddr()
	if err != nil {
		return err
	}
	opArgs := append([]string{"--k8s-kubeconfig-path=" + opKube, "--operator-api-serve-addr=" + opAddr,
		"--leader-election-namespace=" + install.Namespace, sliceArg,
		// The simulated pods have no Pod objects, and their identities
		// must outlive the run.
		"--cilium-endpoint-gc-interval=0", "--identity-gc-interval=24h"}, slices.Concat(cesArgs, kvArgs, r.cfg.OperatorArgs)...)
	if err := r.startProc("cellium-operator", filepath.Join(bin, "cellium-operator"), nil, opArgs...); err != nil {
		return err
	}
	if err := r.waitFor(ctx, time.Minute, "the operator's CRDs", func() error {
		_, err := r.cilium.CiliumV2().CiliumNodes().List(ctx, metav1.ListOptions{Limit: 1})
		if err != nil {
			return err
		}
		_, err = r.cilium.CiliumV2alpha1().CiliumEndpointSlices().List(ctx, metav1.ListOptions{Limit: 1})
		return err
	}); err != nil {
		return err
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: agentNode},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.0.2.30"}}}}
	if _, err := r.kube.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create the agent's node: %w", err)
	}
	promAddr, err := freeAddr()
	if err != nil {
		return err
	}
	r.metrics = "http://" + promAddr + "/metrics"
	socket := filepath.Join(r.dir, "agent.sock")
	state := filepath.Join(r.dir, "agent-state")
	// The memory samples start with a GC through the pprof server, and
	// -heap-profile reads the heap profile from it.
	pprofAddr, err := freeAddr()
	if err != nil {
		return err
	}
	host, port, _ := net.SplitHostPort(pprofAddr)
	r.pprof = "http://" + pprofAddr
	pprofArgs := []string{"--pprof", "--pprof-address=" + host, "--pprof-port=" + port}
	agentArgs := append([]string{"--k8s-kubeconfig-path=" + agentKube, "--socket-path=" + socket,
		"--prometheus-serve-addr=" + promAddr, "--state-dir=" + state, "--write-cni-conf-when-ready=",
		"--enable-endpoint-routes=false", "--enable-bpf-datapath=false", "--enable-endpoint-health-checking=false", sliceArg},
		append(append(append([]string{}, kvArgs...), pprofArgs...), r.cfg.AgentArgs...)...)
	agentEnv := []string{"K8S_NODE_NAME=" + agentNode}
	if r.cfg.HeapProfile != "" {
		// Sample an allocation every 4 KiB on average rather than 512:
		// the profile then shows the small per-endpoint allocations. The
		// runtime keeps its samples outside the heap, so the heap figures
		// stay comparable.
		agentEnv = append(agentEnv, "GODEBUG=memprofilerate=4096")
	}
	if err := r.startProc("cellium-agent", filepath.Join(bin, "cellium-agent"), agentEnv, agentArgs...); err != nil {
		return err
	}
	r.api = client.New(socket)
	return r.waitFor(ctx, 2*time.Minute, "the agent's IPAM", func() error {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		a, err := r.api.AllocateIP(ctx, localNamespace+"/probe", "probe")
		if err != nil {
			return err
		}
		return r.api.ReleaseIP(ctx, a.IPv4.IP)
	})
}

// startProc starts one of cellium's daemons, logging into the work
// directory.
func (r *runner) startProc(name, path string, env []string, args ...string) error {
	p, err := harness.Process{Name: name, Path: path, Args: args, Env: env,
		LogFile: filepath.Join(r.dir, name+".log")}.Start()
	if err != nil {
		return err
	}
	r.procs = append(r.procs, p)
	return nil
}

// stop stops the daemons and the cluster; after a failure it logs the
// tails of the daemons' logs.
func (r *runner) stop(failed bool) error {
	if r.api != nil {
		r.api.Close()
	}
	for _, p := range slices.Backward(r.procs) {
		_ = p.Stop(30 * time.Second)
	}
	if r.etcd != nil {
		_ = r.etcd.Close()
	}
	r.scraper.CloseIdleConnections()
	if r.c == nil {
		return nil
	}
	if failed {
		if r.cfg.KeepDir {
			r.cfg.Log.Error("simulation failed; logs kept", "dir", r.dir)
		} else {
			r.cfg.Log.Error("simulation failed; the logs' tails follow (keep them all with -keep)")
		}
		for _, p := range r.procs {
			r.cfg.Log.Error("log tail", "process", p.Name(), "tail", p.LogTail(20))
		}
	}
	return r.c.Stop()
}

// waitFor polls cond every 100 ms until it returns nil, a daemon exits
// or timeout passes.
func (r *runner) waitFor(ctx context.Context, timeout time.Duration, what string, cond func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return nil
		}
		for _, p := range r.procs {
			select {
			case <-p.Done():
				return fmt.Errorf("waiting for %s: %s exited: %v\n%s", what, p.Name(), p.Err(), p.LogTail(30))
			default:
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("timed out after %s waiting for %s: %w", timeout, what, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// localEndpoint creates the agent's own pod and, as the CNI ADD does,
// its address and endpoint; it returns the endpoint's ID.
func (r *runner) localEndpoint(ctx context.Context) (uint16, error) {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: localNamespace}}
	if _, err := r.kube.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		return 0, fmt.Errorf("create namespace %s: %w", localNamespace, err)
	}
	// No controller-manager makes the namespace's default ServiceAccount.
	if err := r.c.EnsureServiceAccount(ctx, localNamespace); err != nil {
		return 0, err
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "local", Namespace: localNamespace, Labels: map[string]string{"app": localApp}},
		Spec:       corev1.PodSpec{NodeName: agentNode, Containers: []corev1.Container{{Name: "c", Image: "example.invalid/none"}}},
	}
	created, err := r.kube.CoreV1().Pods(localNamespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return 0, fmt.Errorf("create the local pod: %w", err)
	}
	var id uint16
	err = r.waitFor(ctx, time.Minute, "the local pod's endpoint", func() error {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		a, err := r.api.AllocateIP(ctx, localNamespace+"/local", "cid-local")
		if err != nil {
			return err
		}
		ep, err := r.api.PutEndpoint(ctx, &models.EndpointChangeRequest{
			ContainerID: "cid-local", ContainerInterfaceName: "eth0", K8sNamespace: localNamespace, K8sPodName: "local",
			K8sUID: string(created.UID), InterfaceName: "lxclocal", Addressing: models.AddressPair{IPV4: a.IPv4.IP},
			SyncBuildEndpoint: true,
		})
		if err != nil {
			_, _ = r.api.ReleaseContainerIP(ctx, a.IPv4.IP, "cid-local")
			return err
		}
		id = uint16(ep.ID)
		return nil
	})
	return id, err
}

// memory returns the agent's Go heap in use (least of 10 samples over
// 5 s after a full GC), its resident set (last sample) and its live heap
// (allocated bytes in the first sample after the GC).
func (r *runner) memory(ctx context.Context) (heap, rss, live float64, err error) {
	// A full GC first (the pprof handler's gc=1: runtime.GC returns with
	// every span swept), so that the samples start from the live heap
	// rather than from wherever the GC cycle happens to be.
	if err := r.agentGC(ctx); err != nil {
		return 0, 0, 0, err
	}
	heap = -1
	for i := range 10 {
		if i > 0 {
			time.Sleep(500 * time.Millisecond)
		}
		s, err := scrape(ctx, r.scraper, r.metrics)
		if err != nil {
			return 0, 0, 0, err
		}
		if i == 0 {
			live = s.get("go_memstats_heap_alloc_bytes")
		}
		if h := s.get("go_memstats_heap_inuse_bytes"); heap < 0 || h < heap {
			heap = h
		}
		rss = s.get("process_resident_memory_bytes")
	}
	return heap, rss, live, nil
}

// agentGC makes the agent run a full garbage collection: the heap
// profile handler does one first with gc=1 (debug=1: a small text
// profile, no gzip writer).
func (r *runner) agentGC(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.pprof+"/debug/pprof/heap?gc=1&debug=1", nil)
	if err != nil {
		return err
	}
	resp, err := r.scraper.Do(req)
	if err != nil {
		return fmt.Errorf("the agent's GC: %w", err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("the agent's GC: %s", resp.Status)
	}
	return nil
}

// saveHeapProfile writes the agent's heap profile, taken after a GC, to
// path.
func (r *runner) saveHeapProfile(ctx context.Context, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.pprof+"/debug/pprof/heap?gc=1", nil)
	if err != nil {
		return err
	}
	c := &http.Client{Timeout: time.Minute}
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("the agent's heap profile: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("the agent's heap profile: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("the agent's heap profile: %s", resp.Status)
	}
	if err := os.WriteFile(path, body, 0o644); err != nil {
		return fmt.Errorf("save the agent's heap profile: %w", err)
	}
	return nil
}

// agentCPU returns the agent's CPU seconds so far.
func (r *runner) agentCPU(ctx context.Context) (float64, error) {
	s, err := scrape(ctx, r.scraper, r.metrics)
	if err != nil {
		return 0, err
	}
	return s.get("process_cpu_seconds_total"), nil
}

// parallel runs f(i) for i in [0, n) with cfg.Concurrency in flight and
// returns the first error.
func (r *runner) parallel(ctx context.Context, n int, f func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var (
		next atomic.Int64
		wg   sync.WaitGroup
	)
	for range min(n, r.cfg.Concurrency) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				if err := f(ctx, i); err != nil {
					cancel(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return ctx.Err()
}

// populate creates the namespaces, identities, nodes, pods' CEPs,
// Services and NetworkPolicies; in kvstore mode also the nodes' session
// leases, node keys and the pods' ipcache keys.
func (r *runner) populate(ctx context.Context) error {
	cfg := r.cfg
	r.log("creating namespaces and identities", "identities", cfg.Identities)
	if err := r.parallel(ctx, namespaces, func(ctx context.Context, i int) error {
		_, err := r.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nsName(i)}}, metav1.CreateOptions{})
		return wrap(err, "create namespace")
	}); err != nil {
		return err
	}
	if cfg.Mode == ModeKVStore {
		if err := r.grantLeases(ctx); err != nil {
			return err
		}
	}
	if err := r.parallel(ctx, cfg.Identities, func(ctx context.Context, i int) error {
		if cfg.Mode == ModeKVStore {
			return r.kvstoreIdentity(ctx, i)
		}
		_, err := r.cilium.CiliumV2().CiliumIdentities().Create(ctx, ciliumIdentity(i), metav1.CreateOptions{})
		return wrap(err, "create identity")
	}); err != nil {
		return err
	}
	r.log("creating CiliumNodes", "nodes", cfg.Nodes)
	if err := r.parallel(ctx, cfg.Nodes, func(ctx context.Context, n int) error {
		// In kvstore mode a node's agent writes both its CiliumNode and
		// its node key, as Cilium's does.
		if cfg.Mode == ModeKVStore {
			if err := r.putNodeKey(ctx, n); err != nil {
				return err
			}
		}
		_, err := r.cilium.CiliumV2().CiliumNodes().Create(ctx, ciliumNode(n), metav1.CreateOptions{})
		return wrap(err, "create CiliumNode")
	}); err != nil {
		return err
	}
	r.pool = newAddressPool(cfg.Nodes)
	r.pods = make([]remotePod, cfg.Pods)
	podIdentities := min(cfg.Identities, max(1, cfg.Pods/podsPerIdentity))
	for j := range r.pods {
		n := j % cfg.Nodes
		ip, err := r.pool.get(n)
		if err != nil {
			return err
		}
		r.pods[j] = remotePod{name: r.podName(), node: n, identity: j % podIdentities, ip: ip}
	}
	r.log("creating the remote pods' endpoints", "pods", cfg.Pods)
	if err := r.parallel(ctx, cfg.Pods, func(ctx context.Context, j int) error {
		return r.addPod(ctx, r.pods[j])
	}); err != nil {
		return err
	}
	r.log("creating Services and NetworkPolicies", "services", cfg.Services, "policies", cfg.Policies)
	if err := r.parallel(ctx, cfg.Services, func(ctx context.Context, s int) error {
		var backends []remotePod
		for k := range 3 {
			backends = append(backends, r.pods[(s*3+k)%len(r.pods)])
		}
		svc, eps := service(s, backends)
		if _, err := r.kube.CoreV1().Services(svc.Namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			return wrap(err, "create Service")
		}
		_, err := r.kube.DiscoveryV1().EndpointSlices(eps.Namespace).Create(ctx, eps, metav1.CreateOptions{})
		return wrap(err, "create EndpointSlice")
	}); err != nil {
		return err
	}
	return r.parallel(ctx, cfg.Policies, func(ctx context.Context, p int) error {
		np := networkPolicy(p)
		_, err := r.kube.NetworkingV1().NetworkPolicies(np.Namespace).Create(ctx, np, metav1.CreateOptions{})
		return wrap(err, "create NetworkPolicy")
	})
}

func (r *runner) podName() string { return fmt.Sprintf("pod-%07d", r.names.Add(1)) }

// addPod writes what a new remote pod's agent writes: its CiliumEndpoint
// and, in kvstore mode, first its ipcache key (the write the latency is
// measured from in that mode). A Cilium agent in kvstore mode still
// writes CiliumEndpoints (only --disable-endpoint-crd stops that), though
// it watches none.
func (r *runner) addPod(ctx context.Context, p remotePod) error {
	if r.cfg.Mode == ModeKVStore {
		if err := r.putIPCacheKey(ctx, p); err != nil {
			return err
		}
	}
	_, err := r.cilium.CiliumV2().CiliumEndpoints(p.namespace()).Create(ctx, p.ciliumEndpoint(), metav1.CreateOptions{})
	return wrap(err, "create CiliumEndpoint")
}

// removePod deletes what a deleted remote pod's agent deletes: in
// kvstore mode its ipcache key, then its CiliumEndpoint (one already gone
// is no error).
func (r *runner) removePod(ctx context.Context, p remotePod) error {
	if r.cfg.Mode == ModeKVStore {
		if err := r.deleteIPCacheKey(ctx, p); err != nil {
			return err
		}
	}
	err := r.cilium.CiliumV2().CiliumEndpoints(p.namespace()).Delete(ctx, p.name, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return wrap(err, "delete CiliumEndpoint")
}

// ipcacheSource is the source of the agent's ipcache rows the remote
// pods' writes make: their ipcache keys in kvstore mode (they win over
// the CiliumEndpoints), else their CiliumEndpoints (or slices).
func (r *runner) ipcacheSource() ipcache.Source {
	if r.cfg.Mode == ModeKVStore {
		return ipcache.SourceKVStore
	}
	return ipcache.SourceCiliumEndpoint
}

func wrap(err error, what string) error {
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// waitIPCache waits until the ipcache maps every pod's address to its
// identity.
func (r *runner) waitIPCache(ctx context.Context, w *ipcacheWatch, pods []remotePod, timeout time.Duration) error {
	last := -1
	return r.waitFor(ctx, timeout, "the remote pods in the agent's ipcache", func() error {
		n, example, err := w.missing(pods)
		if err != nil {
			return watchEnded(err)
		}
		if n != last && n > 0 {
			r.log("waiting for the ipcache", "missing", n)
			last = n
		}
		if n > 0 {
			time.Sleep(400 * time.Millisecond)
			return fmt.Errorf("%d pods missing, e.g. %s", n, example)
		}
		return nil
	})
}

func watchEnded(err error) error { return fmt.Errorf("the ipcache watch ended: %w", err) }

// churn replaces pods at cfg.Churn/2 per second for cfg.ChurnDuration
// (each replacement: the old pod's CEP deleted, a new pod's CEP with a
// new address created; in kvstore mode the old pod's ipcache key deleted
// before its CEP and the new one's put before its CEP), samples the new
// pods' ipcache latency (from the CEP's create, in kvstore mode from the
// ipcache key's put), and
// measures the agent's CPU, the watch events and cellium's writes over
// the window.
func (r *runner) churn(ctx context.Context, res *Result, w *ipcacheWatch) error {
	cfg := r.cfg
	replacements := min(len(r.pods), int(cfg.Churn/2*cfg.ChurnDuration.Seconds()))
	if replacements == 0 {
		return nil
	}
	// Idle CPU first.
	c0, err := r.agentCPU(ctx)
	if err != nil {
		return err
	}
	t0 := time.Now()
	time.Sleep(10 * time.Second)
	c1, err := r.agentCPU(ctx)
	if err != nil {
		return err
	}
	res.IdleCPU = (c1 - c0) / time.Since(t0).Seconds()

	mark, err := r.auditMark()
	if err != nil {
		return err
	}
	watch0, err := r.watchEvents(ctx)
	if err != nil {
		return err
	}
	cpu0, err := r.agentCPU(ctx)
	if err != nil {
		return err
	}
	start := time.Now()
	r.log("churning", "changes/s", cfg.Churn, "for", cfg.ChurnDuration, "replacements", replacements)
	every := max(1, replacements/cfg.Samples)
	interval := time.Duration(float64(time.Second) / (cfg.Churn / 2))
	// Each replaced pod is one of the pods created before the churn, and
	// no pod is replaced twice: a sampled new pod is never deleted before
	// the agent could learn it (in CES mode the operator would fold its
	// creation and deletion into one slice write, and the ipcache never
	// have it).
	order := rand.New(rand.NewPCG(1, 2)).Perm(len(r.pods))[:replacements]
	var (
		wg       sync.WaitGroup
		errMu    sync.Mutex
		firstErr error
		sem      = make(chan struct{}, cfg.Concurrency)
	)
	for k, j := range order {
		if d := time.Until(start.Add(time.Duration(k) * interval)); d > 0 {
			time.Sleep(d)
		}
		old := r.pods[j]
		ip, err := r.pool.get(old.node)
		if err != nil {
			return err
		}
		nu := remotePod{name: r.podName(), node: old.node, identity: old.identity, ip: ip}
		sample := k%every == 0 && k/every < cfg.Samples
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			err := r.removePod(ctx, old)
			if err == nil {
				if sample {
					w.expect(nu.ip, identityID(nu.identity), time.Now())
				}
				err = r.addPod(ctx, nu)
			}
			if err != nil {
				errMu.Lock()
				firstErr = cmpErr(firstErr, fmt.Errorf("replace pod %s: %w", old.name, err))
				errMu.Unlock()
				return
			}
			r.pool.put(old.node, old.ip)
			r.pods[j] = nu // j is this goroutine's alone
		})
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	res.Changes = 2 * replacements
	// The window ends when the sampled pods are all in (or 2 minutes
	// later).
	deadline := time.Now().Add(2 * time.Minute)
	for {
		got, unseen := w.latencies()
		if unseen == 0 || time.Now().After(deadline) {
			res.IPCache, res.IPCacheMissed = summarise(got), unseen
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	res.ChurnWindow = time.Since(start)
	cpu1, err := r.agentCPU(ctx)
	if err != nil {
		return err
	}
	res.ChurnCPU = cpu1 - cpu0
	watch1, err := r.watchEvents(ctx)
	if err != nil {
		return err
	}
	res.WatchEvents = map[string]float64{}
	for k, v := range watch1 {
		if d := v - watch0[k]; d > 0 {
			res.WatchEvents[k] = d
		}
	}
	if res.Writes, err = r.auditSince(mark); err != nil {
		return err
	}
	// Every pod, not only the samples, reaches the ipcache.
	if err := r.waitIPCache(ctx, w, r.pods, 2*time.Minute); err != nil {
		return err
	}
	r.log("churn done", "window", res.ChurnWindow.Round(time.Millisecond), "ipcache p50", res.IPCache.P50, "p99", res.IPCache.P99)
	return nil
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// watchEvents returns the API server's apiserver_watch_events_total by
// kind.
func (r *runner) watchEvents(ctx context.Context) (map[string]float64, error) {
	raw, err := r.kube.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the API server's metrics: %w", err)
	}
	s, err := parseSamples(strings.NewReader(string(raw)))
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for series, v := range s {
		base, labels, _ := strings.Cut(series, "{")
		if base != "apiserver_watch_events_total" {
			continue
		}
		kind := "?"
		if _, rest, ok := strings.Cut(labels, `kind="`); ok {
			kind, _, _ = strings.Cut(rest, `"`)
		} else if _, rest, ok := strings.Cut(labels, `resource="`); ok {
			kind, _, _ = strings.Cut(rest, `"`)
		}
		out[kind] += v
	}
	return out, nil
}

// auditMark is the number of audit events so far.
func (r *runner) auditMark() (int, error) {
	evs, err := harness.ReadAuditLog(r.c.AuditLogPath())
	return len(evs), err
}

// auditSince counts cellium's writes after mark by "who resource verb".
func (r *runner) auditSince(mark int) (map[string]int, error) {
	evs, err := harness.ReadAuditLog(r.c.AuditLogPath())
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, e := range evs[mark:] {
		if e.Stage != "ResponseComplete" || e.ObjectRef == nil {
			continue
		}
		who := "operator"
		if e.User.Username == agentUser {
			who = "agent"
		}
		out[who+" "+e.Resource()+" "+e.Verb]++
	}
	return out, nil
}

// measuredPolicy is the CiliumClusterwideNetworkPolicy whose changes are
// timed: the local pod accepts traffic from one group of identities.
func measuredPolicy(group string) (*ciliumv2.CiliumClusterwideNetworkPolicy, error) {
	var p ciliumv2.CiliumClusterwideNetworkPolicy
	doc := `{"metadata":{"name":"scale-measured"},"spec":{"endpointSelector":{"matchLabels":{"app":"` + localApp +
		`"}},"ingress":[{"fromEndpoints":[{"matchLabels":{"` + groupLabel + `":"` + group + `"}}]}]}}`
	if err := json.Unmarshal([]byte(doc), &p); err != nil {
		return nil, fmt.Errorf("measured policy: %w", err)
	}
	return &p, nil
}

// policyChanges writes the measured policy cfg.PolicyChanges times, each
// time selecting another group, and times each write until the local
// endpoint's desired policy allows exactly that group's identities.
func (r *runner) policyChanges(ctx context.Context, res *Result, w *policyWatch) error {
	ccnps := r.cilium.CiliumV2().CiliumClusterwideNetworkPolicies()
	var lat []time.Duration
	for k := range r.cfg.PolicyChanges {
		g := k % groups
		var want []int64
		for i := g; i < r.cfg.Identities; i += groups {
			want = append(want, identityID(i))
		}
		res.PolicyIdentities = len(want)
		// The previous change's group, which must be gone.
		other := identityID((g + groups - 1) % groups)
		p, err := measuredPolicy(groupOf(g))
		if err != nil {
			return err
		}
		t0 := time.Now()
		if k == 0 {
			_, err = ccnps.Create(ctx, p, metav1.CreateOptions{})
		} else {
			// The agent writes the policy's status: retry on a conflict.
			err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
				cur, err := ccnps.Get(ctx, p.Name, metav1.GetOptions{})
				if err != nil {
					return err
				}
				cur.Spec = p.Spec
				t0 = time.Now()
				_, err = ccnps.Update(ctx, cur, metav1.UpdateOptions{})
				return err
			})
		}
		if err != nil {
			return fmt.Errorf("write the measured policy: %w", err)
		}
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		seen, err := w.waitFor(wctx, func(ids map[int64]bool) bool {
			if len(want) > 1 && ids[other] {
				return false
			}
			for _, id := range want {
				if !ids[id] {
					return false
				}
			}
			return true
		})
		cancel()
		if err != nil {
			return fmt.Errorf("policy change %d (group %s): %w", k, groupOf(g), err)
		}
		lat = append(lat, seen.Sub(t0))
	}
	res.Policy = summarise(lat)
	r.log("policy changes", "p50", res.Policy.P50, "max", res.Policy.Max)
	return nil
}

// freeAddr returns a free 127.0.0.1 port's address.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}
