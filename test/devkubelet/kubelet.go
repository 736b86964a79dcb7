package devkubelet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// Defaults of Config.
const (
	DefaultWorkers = 16
)

// Budgets of the CNI calls. They do not depend on the context of Run, so
// that stopping the kubelet never kills a plugin half-way through.
const (
	addTimeout = 3 * time.Minute
	delTimeout = 2 * time.Minute
	apiTimeout = 30 * time.Second
)

// Retry delays of a pod whose sync failed (exponential per pod), and of a
// pod that waits for the CNI network to be configured.
const (
	retryBase       = 200 * time.Millisecond
	retryMax        = 30 * time.Second
	networkWaitPoll = 500 * time.Millisecond
)

// Config configures a [Kubelet].
type Config struct {
	// NodeName is the node the kubelet registers and whose pods
	// (spec.nodeName) it runs. Required.
	NodeName string
	// NodeIP is reported as the node's InternalIP and as each pod's
	// hostIP. Nothing routes to it: an address of the loopback range
	// (127.0.0.2) is fine for a node on this machine. Required.
	NodeIP netip.Addr
	// CNIConfDir holds the network configuration; the first .conflist
	// (.conf, .json) file in lexical order is the network, as in
	// containerd. Required.
	CNIConfDir string
	// CNIBinDirs are searched for the plugin binaries. Required.
	CNIBinDirs []string
	// StateDir keeps the sandbox records and libcni's cache; a restarted
	// kubelet with the same StateDir adopts its sandboxes. Required.
	StateDir string
	// NetnsDir is where the pods' network namespaces are pinned; default
	// DefaultNetnsDir, so that `ip netns` sees them.
	NetnsDir string
	// Workers is how many pods are set up or torn down at once; default
	// DefaultWorkers.
	Workers int
	// PluginNetns, when set, is the network namespace (a path such as
	// /run/netns/x) the CNI plugins run in, as the node's own namespace:
	// their host-side links, routes and sysctls go there instead of into
	// this process's namespace. devkubelet bench runs the reference
	// plugins so, leaving the machine's namespace untouched.
	PluginNetns string
	// Logger receives progress and errors; nil discards them.
	Logger *slog.Logger
	// SandboxIDPrefix, hexadecimal digits (at most 16), starts every
	// sandbox ID this kubelet makes, so that a test can tell its own
	// container IDs (in veth aliases, say) from those of other tests on
	// the machine. Empty means fully random IDs.
	SandboxIDPrefix string
}

func (c *Config) setDefaults() error {
	var missing []string
	if c.NodeName == "" {
		missing = append(missing, "NodeName")
	}
	if !c.NodeIP.IsValid() {
		missing = append(missing, "NodeIP")
	}
	if c.CNIConfDir == "" {
		missing = append(missing, "CNIConfDir")
	}
	if len(c.CNIBinDirs) == 0 {
		missing = append(missing, "CNIBinDirs")
	}
	if c.StateDir == "" {
		missing = append(missing, "StateDir")
	}
	if len(missing) > 0 {
		return fmt.Errorf("devkubelet configuration lacks %v", missing)
	}
	if len(c.SandboxIDPrefix) > maxSandboxIDPrefix || strings.Trim(strings.ToLower(c.SandboxIDPrefix), "0123456789abcdef") != "" {
		return fmt.Errorf("devkubelet SandboxIDPrefix %q: want at most %d hexadecimal digits", c.SandboxIDPrefix, maxSandboxIDPrefix)
	}
	c.SandboxIDPrefix = strings.ToLower(c.SandboxIDPrefix)
	if c.NetnsDir == "" {
		c.NetnsDir = DefaultNetnsDir
	}
	if c.Workers <= 0 {
		c.Workers = DefaultWorkers
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Kubelet is a minimal kubelet for one node: it registers the Node, and
// for each pod bound to the node makes a network namespace, attaches it
// with CNI ADD exactly as a container runtime does and reports the pod
// Running with its IP; it tears the sandbox down with CNI DEL when the pod
// is deleted, finishes or is replaced. It runs no containers.
type Kubelet struct {
	cfg   Config
	cs    kubernetes.Interface
	log   *slog.Logger
	cni   *cniRuntime
	store sandboxStore

	running atomic.Bool

	mu        sync.Mutex
	sandboxes map[string]*Sandbox // by pod key "namespace/name"
	timings   map[types.UID]*PodTiming
	lastEvent map[string]string // last failure reported per pod key
}

// New checks cfg and creates the kubelet's directories. It contacts
// nobody; [Kubelet.Run] does the work.
func New(cfg Config, cs kubernetes.Interface) (*Kubelet, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	k := &Kubelet{
		cfg:       cfg,
		cs:        cs,
		log:       cfg.Logger.With("node", cfg.NodeName),
		cni:       newCNIRuntime(cfg.CNIConfDir, cfg.CNIBinDirs, filepath.Join(cfg.StateDir, "cni-cache"), cfg.PluginNetns),
		store:     sandboxStore{dir: filepath.Join(cfg.StateDir, "sandboxes")},
		sandboxes: map[string]*Sandbox{},
		timings:   map[types.UID]*PodTiming{},
		lastEvent: map[string]string{},
	}
	if err := os.MkdirAll(k.store.dir, 0o755); err != nil {
		return nil, fmt.Errorf("devkubelet state directory: %w", err)
	}
	return k, nil
}

// NodeName is the node the kubelet runs.
func (k *Kubelet) NodeName() string { return k.cfg.NodeName }

// NodeIP is the node's InternalIP.
func (k *Kubelet) NodeIP() netip.Addr { return k.cfg.NodeIP }

// Run registers the node and runs the pods bound to it until ctx ends.
// It first loads the sandboxes an earlier run recorded: those of pods that
// still exist (same UID) are adopted as they are, the others are torn
// down. Run returns after its workers have finished the pods they were
// working on; it leaves the sandboxes in place (see [Kubelet.Cleanup]).
//
// Errors: Run is already running; a sandbox record is corrupt; the Node
// cannot be registered; the pod cache never synced.
func (k *Kubelet) Run(ctx context.Context) error {
	if !k.running.CompareAndSwap(false, true) {
		return errors.New("devkubelet is already running")
	}
	defer k.running.Store(false)

	if err := k.loadSandboxes(); err != nil {
		return err
	}
	netReady := k.networkReady()
	if err := k.registerNode(ctx, netReady); err != nil {
		return err
	}

	factory := informers.NewSharedInformerFactoryWithOptions(k.cs, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = "spec.nodeName=" + k.cfg.NodeName
		}))
	podInformer := factory.Core().V1().Pods()
	queue := workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedItemExponentialFailureRateLimiter[string](retryBase, retryMax),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "devkubelet-" + k.cfg.NodeName})
	enqueue := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			queue.Add(key)
		}
	}
	if _, err := podInformer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
		DeleteFunc: enqueue,
	}); err != nil {
		queue.ShutDown()
		return fmt.Errorf("watch pods: %w", err)
	}
	lister := podInformer.Lister()
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	defer queue.ShutDown()
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("pod cache of %v never synced", typ)
		}
	}
	// Sandboxes whose pods are gone get no pod event: queue them.
	for _, sb := range k.Sandboxes() {
		queue.Add(sb.Key())
	}

	var wg sync.WaitGroup
	for range k.cfg.Workers {
		wg.Go(func() {
			for k.processNext(queue, lister) {
			}
		})
	}
	wg.Go(func() { k.heartbeat(ctx, netReady, queue, lister) })
	k.log.Info("devkubelet running", "nodeIP", k.cfg.NodeIP, "cniConfDir", k.cfg.CNIConfDir, "adopted", len(k.Sandboxes()))

	<-ctx.Done()
	queue.ShutDown() // workers finish their current pod, then return
	wg.Wait()
	return nil
}

// processNext syncs one pod; false once the queue is shut down.
func (k *Kubelet) processNext(queue workqueue.TypedRateLimitingInterface[string], lister listersv1.PodLister) bool {
	key, shutdown := queue.Get()
	if shutdown {
		return false
	}
	defer queue.Done(key)
	err := k.syncPod(key, lister)
	switch {
	case err == nil:
		queue.Forget(key)
	case errors.Is(err, errNoNetwork):
		// Not the pod's fault: look again soon, without backing off.
		queue.Forget(key)
		queue.AddAfter(key, networkWaitPoll)
	default:
		k.log.Warn("pod sync failed; will retry", "pod", key, "retries", queue.NumRequeues(key), "error", err)
		queue.AddRateLimited(key)
	}
	return true
}

// syncPod brings one pod's sandbox in line with the pod object.
func (k *Kubelet) syncPod(key string, lister listersv1.PodLister) error {
	namespace, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil // not a key we queue
	}
	pod, err := lister.Pods(namespace).Get(name)
	if apierrors.IsNotFound(err) {
		pod = nil
	} else if err != nil {
		return err
	}

	if sb := k.sandbox(key); sb != nil {
		if reason := k.staleReason(sb, pod); reason != "" {
			k.log.Debug("tearing down sandbox", "pod", key, "sandbox", shortID(sb.ID), "reason", reason)
			if err := k.teardown(sb); err != nil {
				return err
			}
		}
	}
	if pod == nil || pod.Spec.NodeName != k.cfg.NodeName {
		return nil
	}
	if pod.DeletionTimestamp != nil {
		// The sandbox is gone: confirm the deletion, as kubelet does once
		// the containers have stopped.
		return k.confirmDeletion(pod)
	}
	if podFinished(pod) {
		return nil
	}
	k.noteSeen(pod)
	if pod.Spec.HostNetwork {
		return k.writeRunning(pod, k.cfg.NodeIP.String())
	}
	sb := k.sandbox(key)
	if sb == nil {
		if sb, err = k.createSandbox(pod); err != nil {
			return err
		}
	}
	return k.writeRunning(pod, sb.IP)
}

// staleReason says why a sandbox must go, or "" if it serves the pod.
func (k *Kubelet) staleReason(sb *Sandbox, pod *corev1.Pod) string {
	switch {
	case pod == nil || pod.Spec.NodeName != k.cfg.NodeName:
		return "pod deleted"
	case pod.UID != sb.UID:
		return "pod replaced (new UID)"
	case pod.DeletionTimestamp != nil:
		return "pod terminating"
	case podFinished(pod):
		return "pod finished"
	case sb.State != SandboxReady:
		return "sandbox creation did not complete"
	case !netnsExists(sb.NetnsPath):
		return "network namespace gone"
	}
	return ""
}

func podFinished(pod *corev1.Pod) bool {
	return pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
}

// createSandbox records, creates and attaches a new sandbox for pod. On
// failure everything made is undone (CNI DEL, as runtimes call after a
// failed ADD) and the error is reported as an event on the pod.
func (k *Kubelet) createSandbox(pod *corev1.Pod) (*Sandbox, error) {
	list, err := k.cni.network()
	if err != nil {
		return nil, err
	}
	id := newSandboxID(k.cfg.SandboxIDPrefix)
	sb := &Sandbox{
		ID:        id,
		Namespace: pod.Namespace,
		Name:      pod.Name,
		UID:       pod.UID,
		NetnsPath: filepath.Join(k.cfg.NetnsDir, netnsName(pod.Namespace, pod.Name, id)),
		IfName:    PodInterface,
		State:     SandboxCreating,
		ConfList:  json.RawMessage(list.Bytes),
		Created:   time.Now().UTC(),
	}
	// Record first: a crash from here on leaves a record to clean up by.
	if err := k.store.save(sb); err != nil {
		return nil, err
	}
	k.setSandbox(sb)

	fail := func(err error) (*Sandbox, error) {
		if terr := k.teardown(sb); terr != nil {
			err = fmt.Errorf("%w (and the cleanup failed, retried with the pod: %v)", err, terr)
		}
		k.reportFailure(pod, "FailedCreatePodSandBox", err)
		return nil, err
	}
	if _, err := createNetns(k.cfg.NetnsDir, sb.NetnsName()); err != nil {
		k.mu.Lock()       // Sandboxes() copies the record under mu
		sb.ConfList = nil // nothing attached: DEL not needed
		k.mu.Unlock()
		return fail(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), addTimeout)
	defer cancel()
	start := time.Now()
	res, err := k.cni.add(ctx, list, sb)
	took := time.Since(start)
	if err != nil {
		k.noteAdd(pod.UID, took, err)
		return fail(fmt.Errorf("CNI ADD for pod %s (network %q): %w", sb.Key(), list.Name, err))
	}
	k.noteAdd(pod.UID, took, nil)
	ip, hostIfs := podIP(res)
	if ip == "" {
		return fail(fmt.Errorf("CNI ADD for pod %s (network %q) returned no IP address", sb.Key(), list.Name))
	}
	k.mu.Lock() // Sandboxes() copies the record under mu
	sb.IP, sb.HostInterfaces, sb.State = ip, hostIfs, SandboxReady
	k.mu.Unlock()
	if err := k.store.save(sb); err != nil {
		return fail(err)
	}
	k.log.Debug("sandbox ready", "pod", sb.Key(), "sandbox", shortID(id), "ip", sb.IP, "add", took)
	return sb, nil
}

// teardown detaches (CNI DEL) and removes a sandbox and its record. The
// record stays if DEL fails, so that it is retried.
func (k *Kubelet) teardown(sb *Sandbox) error {
	ctx, cancel := context.WithTimeout(context.Background(), delTimeout)
	defer cancel()
	start := time.Now()
	if err := k.cni.del(ctx, sb); err != nil {
		return fmt.Errorf("CNI DEL for pod %s (sandbox %s): %w", sb.Key(), shortID(sb.ID), err)
	}
	took := time.Since(start)
	if err := removeNetns(sb.NetnsPath); err != nil {
		return err
	}
	if err := k.store.remove(sb.ID); err != nil {
		return err
	}
	k.mu.Lock()
	if k.sandboxes[sb.Key()] == sb {
		delete(k.sandboxes, sb.Key())
	}
	if t := k.timings[sb.UID]; t != nil && len(sb.ConfList) > 0 {
		t.Del, t.Gone = took, time.Now()
	}
	k.mu.Unlock()
	return nil
}

// confirmDeletion deletes a terminating pod for good (grace period 0),
// only if it is still the pod the kubelet saw.
func (k *Kubelet) confirmDeletion(pod *corev1.Pod) error {
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	zero := int64(0)
	err := k.cs.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: &zero,
		Preconditions:      &metav1.Preconditions{UID: &pod.UID},
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("delete pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}

// loadSandboxes reads the records of an earlier run. Of two records of
// the same pod (a crash while replacing one) the older is torn down now.
func (k *Kubelet) loadSandboxes() error {
	records, err := k.store.load()
	if err != nil {
		return err
	}
	slices.SortFunc(records, func(a, b *Sandbox) int { return a.Created.Compare(b.Created) })
	k.mu.Lock()
	clear(k.sandboxes) // the records are the truth
	var older []*Sandbox
	for _, sb := range records {
		if prev := k.sandboxes[sb.Key()]; prev != nil {
			older = append(older, prev)
		}
		k.sandboxes[sb.Key()] = sb
	}
	k.mu.Unlock()
	var errs []error
	for _, sb := range older {
		errs = append(errs, k.teardown(sb))
	}
	return errors.Join(errs...)
}

func (k *Kubelet) sandbox(key string) *Sandbox {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.sandboxes[key]
}

func (k *Kubelet) setSandbox(sb *Sandbox) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.sandboxes[sb.Key()] = sb
}

// Sandboxes returns copies of the sandboxes the kubelet holds, ordered by
// pod key.
func (k *Kubelet) Sandboxes() []Sandbox {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make([]Sandbox, 0, len(k.sandboxes))
	for _, sb := range k.sandboxes {
		out = append(out, *sb)
	}
	slices.SortFunc(out, func(a, b Sandbox) int {
		if a.Key() < b.Key() {
			return -1
		} else if a.Key() > b.Key() {
			return 1
		}
		return 0
	})
	return out
}

// Cleanup tears down every sandbox the kubelet holds or has on record
// (CNI DEL, then the network namespace) and deletes the Node and its
// Lease. Call it after Run has returned. A sandbox whose DEL fails until
// ctx ends has its network namespace removed anyway; the error says which.
func (k *Kubelet) Cleanup(ctx context.Context) error {
	if k.running.Load() {
		return errors.New("devkubelet cleanup: still running; stop Run first")
	}
	if err := k.loadSandboxes(); err != nil {
		return err
	}
	var errs []error
	for _, sb := range k.Sandboxes() {
		for {
			err := k.teardown(&sb)
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				errs = append(errs, err, removeNetns(sb.NetnsPath), k.store.remove(sb.ID))
				break
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
	k.mu.Lock()
	clear(k.sandboxes)
	k.mu.Unlock()
	errs = append(errs, k.unregisterNode(ctx))
	return errors.Join(errs...)
}
