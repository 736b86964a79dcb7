package harness

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Errors returned by [Start].
var (
	// ErrPortInUse means that Options.APIServerPort is taken by another process.
	ErrPortInUse = errors.New("port in use")
	// ErrAlreadyRunning means that Options.Dir holds a cluster whose processes
	// are still running.
	ErrAlreadyRunning = errors.New("a cluster is already running in this directory")
)

// Errors returned by [Cluster.StopAPIServer] and [Cluster.StartAPIServer].
var (
	// ErrClusterStopped means that [Cluster.Stop] was called.
	ErrClusterStopped = errors.New("the cluster was stopped")
	// ErrAPIServerRunning means that StartAPIServer was called while the API
	// server runs.
	ErrAPIServerRunning = errors.New("kube-apiserver is running")
)

// Names of the components; each names its log file (<name>.log) and pid file
// (<name>.pid) in the work directory.
const (
	Etcd                  = "etcd"
	KubeAPIServer         = "kube-apiserver"
	KubeControllerManager = "kube-controller-manager"
)

// KubeconfigFile is the name of the admin kubeconfig in the work directory.
const KubeconfigFile = "kubeconfig"

// Options configure [Start]. The zero value is a cluster of etcd and
// kube-apiserver in a temporary directory.
type Options struct {
	// ControllerManager also runs kube-controller-manager, for what a real
	// cluster does on its own: ownerReference garbage collection, namespace
	// finalization, the "default" ServiceAccount of every namespace. Adds about
	// half a second to start-up.
	ControllerManager bool

	// Dir is the work directory: PKI, etcd data, logs, pid files and the
	// kubeconfig. Empty means a new temporary directory, which Stop removes
	// unless KeepDir is set. A directory given here is created if needed and
	// never removed by Stop.
	Dir string
	// KeepDir keeps a temporary work directory after Stop, for post-mortems.
	KeepDir bool

	// APIServerPort is the API server's secure port on 127.0.0.1; 0 picks a
	// free one. A port in use fails Start with ErrPortInUse.
	APIServerPort int
	// ServiceClusterIPRange is the API server's Service IP range; default
	// 10.96.0.0/16. It is configuration only: nothing routes to it.
	ServiceClusterIPRange string

	// AdvertiseAddress, if valid, is the address the API server advertises
	// as the endpoint of the kubernetes Service (its endpoint reconciler
	// runs: the Service gets that address and the secure port), so that
	// pods reach it through the Service's ClusterIP, as on a real cluster.
	// The API server then listens on every address of the machine (its
	// --bind-address is single: 127.0.0.1, where the harness's clients
	// connect, and this one, which a pod reaches, need both); the address
	// need not exist yet when the API server starts (test/realnode's node
	// IP comes up with the node). Invalid (the zero value): the API server
	// listens on 127.0.0.1 only and the kubernetes Service has no
	// endpoint.
	AdvertiseAddress netip.Addr

	// BindAddress, if valid, is the one address the API server listens on
	// (--bind-address) instead of 127.0.0.1 (or every address, with
	// AdvertiseAddress): the harness's clients and kubeconfigs connect to
	// it, its serving certificate names it, and it is the advertised
	// address unless AdvertiseAddress says otherwise. For nodes that are
	// network namespaces on a bridge (test/realnode): the bridge's address,
	// which the host reaches as its own and the nodes over their uplink.
	// It must exist on the machine when the API server starts.
	BindAddress netip.Addr

	// EtcdAddress, if valid, is an address etcd also serves its clients
	// on, with the port it has on 127.0.0.1 ([Cluster.EtcdAddressURL]):
	// for cellium's kvstore mode in network namespaces on a bridge
	// (test/realnode's nodes reach the host on the bridge's address). It
	// must exist on the machine when etcd starts; an unspecified address
	// (0.0.0.0, ::) is refused. The API server still reaches etcd on
	// 127.0.0.1.
	EtcdAddress netip.Addr

	// NodeAuthorizer runs the API server with the Node authorizer before
	// RBAC and the NodeRestriction admission plugin, as a real cluster
	// does: a kubelet with a certificate for system:node:<name> in
	// system:nodes ([Cluster.ClientCertKubeconfig]) gets a node's
	// permissions and no more (test/realnode). The API server calls
	// kubelets (logs, exec) with the admin certificate. --authorization-mode
	// is a list flag, so APIServerArgs cannot change it.
	NodeAuthorizer bool

	// APIServerArgs and ControllerManagerArgs are appended to the flags the
	// harness passes (the last occurrence of a flag wins), e.g.
	// "--feature-gates=...".
	APIServerArgs         []string
	ControllerManagerArgs []string

	// AuditPolicy, if not empty, is an audit policy (an audit.k8s.io/v1
	// Policy in YAML) the API server logs requests by, one JSON event a
	// line, into [AuditLogFile] in the work directory
	// ([Cluster.AuditLogPath]; read it with [ReadAuditLog]). Blocking mode:
	// an event is in the file before its request's response is sent.
	AuditPolicy string

	// BeforeControllerManager, if set, runs once the API server is ready
	// and before kube-controller-manager starts (with ControllerManager):
	// for objects its controllers should know from their start, such as
	// CRDs, whose resources the garbage collector otherwise discovers only
	// at its next resync, up to 30 seconds later. An error fails Start.
	BeforeControllerManager func(ctx context.Context, c *Cluster) error

	// Binaries are the programs to run; if KubeAPIServer is empty, Start calls
	// EnsureBinaries (which may build them).
	Binaries Binaries

	// Detach starts the processes in sessions of their own so that they outlive
	// the calling process (see Process.Detach): devcluster up uses it.
	Detach bool

	// StartTimeout bounds the wait for the components to become ready (not
	// the building of binaries); default 2 minutes.
	StartTimeout time.Duration
	// StopTimeout is how long each process gets to exit after SIGTERM before
	// SIGKILL; default 10 seconds.
	StopTimeout time.Duration

	// Logger receives progress messages (building binaries, start-up); nil
	// discards them. Process output goes to log files in Dir, not here.
	Logger *slog.Logger
}

// Cluster is a running control plane started by [Start]. Its methods are safe
// for concurrent use.
type Cluster struct {
	opts   Options
	log    *slog.Logger
	dir    string
	ownDir bool // created by Start: Stop removes it unless KeepDir
	bins   Binaries
	pki    *pki

	etcdURL, apiURL string
	restConfig      *rest.Config
	httpClient      *http.Client
	clientset       *kubernetes.Clientset
	// etcdAddressURL is etcd's client URL on Options.EtcdAddress ("" without).
	etcdAddressURL string

	apiMu     sync.Mutex // serialises StopAPIServer and StartAPIServer
	procMu    sync.Mutex
	procs     []*Running // in start order
	apiProc   Process    // how kube-apiserver was started, for StartAPIServer
	apiServer *Running   // the current kube-apiserver process

	// rbacMu guards rbacDone and saKubeconfigs, the ServiceAccount
	// kubeconfigs written so far.
	rbacMu        sync.Mutex
	rbacDone      bool
	saKubeconfigs map[string]bool

	mu       sync.Mutex
	keepDir  bool
	stopped  atomic.Bool
	stopOnce sync.Once
	stopErr  error
}

// Start starts etcd, kube-apiserver and, with Options.ControllerManager,
// kube-controller-manager on 127.0.0.1, waits until the API server's /readyz is
// ok (and the controller-manager has created the "default" ServiceAccount),
// and writes an admin kubeconfig to the work directory. On success the caller
// must call [Cluster.Stop]. ctx bounds the start only; the cluster runs until
// Stop.
//
// Errors: the binaries cannot be found or built (see [EnsureBinaries]);
// [ErrPortInUse]; [ErrAlreadyRunning]; a component exits or is not ready within
// Options.StartTimeout, in which case the error carries the tail of that
// component's log. Everything started is stopped again before Start returns
// an error.
func Start(ctx context.Context, opts Options) (_ *Cluster, err error) {
	began := time.Now()
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = 2 * time.Minute
	}
	if opts.StopTimeout <= 0 {
		opts.StopTimeout = 10 * time.Second
	}
	if opts.ServiceClusterIPRange == "" {
		opts.ServiceClusterIPRange = "10.96.0.0/16"
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if a := opts.EtcdAddress; a.IsValid() && a.IsUnspecified() {
		return nil, fmt.Errorf("start cluster: EtcdAddress %s: etcd serves no wildcard address", a)
	}
	svcRange, err := netip.ParsePrefix(opts.ServiceClusterIPRange)
	if err != nil {
		return nil, fmt.Errorf("start cluster: service cluster IP range: %w", err)
	}
	serviceIP := svcRange.Masked().Addr().Next() // the kubernetes Service's ClusterIP

	bins := opts.Binaries
	if bins.KubeAPIServer == "" {
		if bins, err = EnsureBinaries(ctx, log); err != nil {
			return nil, fmt.Errorf("start cluster: %w", err)
		}
	}
	if opts.ControllerManager && bins.KubeControllerManager == "" {
		return nil, fmt.Errorf("start cluster: Options.Binaries has no kube-controller-manager")
	}

	c := &Cluster{opts: opts, log: log, bins: bins, keepDir: opts.KeepDir}
	if opts.Dir == "" {
		if c.dir, err = os.MkdirTemp("", "cellium-cluster-"); err != nil {
			return nil, fmt.Errorf("start cluster: %w", err)
		}
		c.ownDir = true
	} else {
		if c.dir, err = filepath.Abs(opts.Dir); err != nil {
			return nil, fmt.Errorf("start cluster: %w", err)
		}
		if err := os.MkdirAll(c.dir, 0o755); err != nil {
			return nil, fmt.Errorf("start cluster: %w", err)
		}
		if err := checkNotRunning(c.dir); err != nil {
			return nil, fmt.Errorf("start cluster: %w", err)
		}
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, c.Stop())
		}
	}()

	if opts.APIServerPort != 0 {
		if err := checkPortFree(opts.APIServerPort); err != nil {
			return nil, fmt.Errorf("start cluster: %w", err)
		}
	}
	var extraIPs []net.IP
	if opts.BindAddress.IsValid() {
		extraIPs = append(extraIPs, opts.BindAddress.AsSlice())
	}
	if c.pki, err = newPKI(filepath.Join(c.dir, "pki"), serviceIP.AsSlice(), extraIPs...); err != nil {
		return nil, fmt.Errorf("start cluster: %w", err)
	}

	startCtx, cancel := context.WithTimeout(ctx, opts.StartTimeout)
	defer cancel()
	if err := c.startEtcd(startCtx); err != nil {
		return nil, fmt.Errorf("start cluster: %w", err)
	}
	if err := c.startAPIServer(startCtx, svcRange.String()); err != nil {
		return nil, fmt.Errorf("start cluster: %w", err)
	}
	if err := c.writeKubeconfig(); err != nil {
		return nil, fmt.Errorf("start cluster: %w", err)
	}
	if opts.ControllerManager {
		if f := opts.BeforeControllerManager; f != nil {
			if err := f(startCtx, c); err != nil {
				return nil, fmt.Errorf("start cluster: before kube-controller-manager: %w", err)
			}
		}
		if err := c.startControllerManager(startCtx); err != nil {
			return nil, fmt.Errorf("start cluster: %w", err)
		}
	} else if err := c.EnsureServiceAccount(startCtx, metav1.NamespaceDefault); err != nil {
		return nil, fmt.Errorf("start cluster: %w", err)
	}
	log.Info("cluster ready", "apiserver", c.apiURL, "kubeconfig", c.Kubeconfig(),
		"controllerManager", opts.ControllerManager, "took", time.Since(began).Round(time.Millisecond))
	return c, nil
}

// Dir is the work directory.
func (c *Cluster) Dir() string { return c.dir }

// Kubeconfig is the path of the admin kubeconfig file (context "cellium").
func (c *Cluster) Kubeconfig() string { return filepath.Join(c.dir, KubeconfigFile) }

// RESTConfig returns a copy of the admin client configuration (user
// cellium-admin in group system:masters; QPS limits raised for tests).
func (c *Cluster) RESTConfig() *rest.Config { return rest.CopyConfig(c.restConfig) }

// Clientset is an admin clientset, shared by all callers.
func (c *Cluster) Clientset() kubernetes.Interface { return c.clientset }

// APIServerURL is the API server's address, https://127.0.0.1:<port>
// (the BindAddress instead, if set).
func (c *Cluster) APIServerURL() string { return c.apiURL }

// EtcdURL is the etcd client address, http://127.0.0.1:<port> (no TLS, no
// authentication). Kubernetes keeps its objects under /registry; the etcd can
// serve cellium's kvstore mode too.
func (c *Cluster) EtcdURL() string { return c.etcdURL }

// EtcdAddressURL is the etcd client address on Options.EtcdAddress,
// http://<address>:<port> (the port of EtcdURL), or "" without one.
func (c *Cluster) EtcdAddressURL() string { return c.etcdAddressURL }

// CACert is the PEM of the CA that signed the API server's certificate.
func (c *Cluster) CACert() []byte { return c.pki.caCert }

// Binaries are the programs the cluster runs.
func (c *Cluster) Binaries() Binaries { return c.bins }

// Processes are the cluster's processes in start order.
func (c *Cluster) Processes() []*Running {
	c.procMu.Lock()
	defer c.procMu.Unlock()
	return append([]*Running(nil), c.procs...)
}

// Ready asks the API server's /readyz and returns nil if it answers ok.
func (c *Cluster) Ready(ctx context.Context) error {
	body, err := c.clientset.CoreV1().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
	if err != nil {
		return fmt.Errorf("readyz: %w: %s", err, body)
	}
	if strings.TrimSpace(string(body)) != "ok" {
		return fmt.Errorf("readyz: %s", body)
	}
	return nil
}

// EnsureServiceAccount creates the "default" ServiceAccount in namespace ns if
// it does not exist, so that pods can be created there without the
// controller-manager (whose ServiceAccount controller otherwise does it).
//
// Errors: the API server refuses the request (e.g. ns does not exist).
func (c *Cluster) EnsureServiceAccount(ctx context.Context, ns string) error {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: ns}}
	_, err := c.clientset.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create default service account in %s: %w", ns, err)
	}
	return nil
}

// Stop stops the processes in reverse start order (SIGTERM, then SIGKILL after
// Options.StopTimeout), closes the clientset's idle connections and removes a
// temporary work directory unless Options.KeepDir. It is idempotent; later
// calls return the first call's result.
func (c *Cluster) Stop() error {
	c.stopOnce.Do(func() {
		c.procMu.Lock()
		c.stopped.Store(true)
		procs := slices.Clone(c.procs)
		c.procMu.Unlock()
		var errs []error
		for i := len(procs) - 1; i >= 0; i-- {
			p, began := procs[i], time.Now()
			errs = append(errs, p.Stop(c.opts.StopTimeout))
			c.log.Debug("component stopped", "name", p.Name(), "pid", p.Pid(), "took", time.Since(began).Round(time.Millisecond))
		}
		if c.httpClient != nil {
			utilnet.CloseIdleConnectionsFor(c.httpClient.Transport)
		}
		c.mu.Lock()
		keep := c.keepDir
		c.mu.Unlock()
		if c.ownDir && !keep {
			errs = append(errs, os.RemoveAll(c.dir))
		} else if c.ownDir {
			c.log.Info("kept cluster work directory", "dir", c.dir)
		}
		if err := errors.Join(errs...); err != nil {
			c.stopErr = fmt.Errorf("stop cluster: %w", err)
		}
	})
	return c.stopErr
}

// keepWorkDir makes Stop keep the work directory.
func (c *Cluster) keepWorkDir() {
	c.mu.Lock()
	c.keepDir = true
	c.mu.Unlock()
}

func (c *Cluster) process(name, path string, args []string) Process {
	return Process{
		Name:    name,
		Path:    path,
		Args:    args,
		Dir:     c.dir,
		LogFile: filepath.Join(c.dir, name+".log"),
		PidFile: filepath.Join(c.dir, name+".pid"),
		Detach:  c.opts.Detach,
	}
}

// portTries is how often a component is started on fresh free ports when the
// ones picked were taken in the meantime by someone else.
const portTries = 3

func (c *Cluster) startEtcd(ctx context.Context) error {
	for try := 1; ; try++ {
		ports, err := freePorts(2)
		if err != nil {
			return fmt.Errorf("start etcd: %w", err)
		}
		client := "http://127.0.0.1:" + strconv.Itoa(ports[0])
		peer := "http://127.0.0.1:" + strconv.Itoa(ports[1])
		clients := client
		c.etcdAddressURL = ""
		if a := c.opts.EtcdAddress; a.IsValid() {
			c.etcdAddressURL = "http://" + net.JoinHostPort(a.String(), strconv.Itoa(ports[0]))
			clients += "," + c.etcdAddressURL
		}
		data := filepath.Join(c.dir, "etcd")
		if err := os.RemoveAll(data); err != nil { // leftovers of a failed try
			return fmt.Errorf("start etcd: %w", err)
		}
		p := c.process(Etcd, c.bins.Etcd, []string{
			"--name=cellium",
			"--data-dir=" + data,
			"--listen-client-urls=" + clients,
			"--advertise-client-urls=" + clients,
			"--listen-peer-urls=" + peer,
			"--initial-advertise-peer-urls=" + peer,
			"--initial-cluster=cellium=" + peer,
			"--unsafe-no-fsync", // a throw-away test store: durability costs start-up time
			"--log-level=warn",
			// One member: elect it at once instead of after the default 1s.
			"--heartbeat-interval=10",
			"--election-timeout=100",
		})
		c.etcdURL = client
		r, err := c.startAndWait(ctx, p, func(ctx context.Context) error { return etcdHealthy(ctx, client) })
		if err == nil || try == portTries || !portClash(r) {
			return err
		}
		c.forget(r)
		c.log.Debug("etcd port taken, retrying", "err", err)
	}
}

func (c *Cluster) startAPIServer(ctx context.Context, svcRange string) error {
	for try := 1; ; try++ {
		port := c.opts.APIServerPort
		if port == 0 {
			ports, err := freePorts(1)
			if err != nil {
				return fmt.Errorf("start kube-apiserver: %w", err)
			}
			port = ports[0]
		}
		host := "127.0.0.1"
		if b := c.opts.BindAddress; b.IsValid() {
			host = b.String()
		}
		c.apiURL = "https://" + net.JoinHostPort(host, strconv.Itoa(port))
		if err := c.newClients(); err != nil {
			return fmt.Errorf("start kube-apiserver: %w", err)
		}
		pki := c.pki
		args := []string{
			"--etcd-servers=" + c.etcdURL,
			"--secure-port=" + strconv.Itoa(port),
		}
		if b := c.opts.BindAddress; b.IsValid() {
			advertise := b
			if c.opts.AdvertiseAddress.IsValid() {
				advertise = c.opts.AdvertiseAddress
			}
			args = append(args, "--bind-address="+b.String(), "--advertise-address="+advertise.String(), "--endpoint-reconciler-type=lease")
		} else if a := c.opts.AdvertiseAddress; a.IsValid() {
			args = append(args, "--bind-address=0.0.0.0", "--advertise-address="+a.String(), "--endpoint-reconciler-type=lease")
		} else {
			args = append(args, "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
				// A loopback address is not a valid endpoint of the kubernetes
				// Service; nothing may be sent to the Service range anyway.
				"--endpoint-reconciler-type=none")
		}
		args = append(args,
			"--cert-dir="+pki.dir,
			"--tls-cert-file="+pki.path(serverCertFile),
			"--tls-private-key-file="+pki.path(serverKeyFile),
			"--client-ca-file="+pki.path(caCertFile),
			"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
			"--service-account-key-file="+pki.path(saPubFile),
			"--service-account-signing-key-file="+pki.path(saKeyFile),
			"--service-cluster-ip-range="+svcRange,
			"--allow-privileged=true",
			"--profiling=false",
		)
		if c.opts.AuditPolicy != "" {
			policy := filepath.Join(c.dir, auditPolicyFile)
			if err := os.WriteFile(policy, []byte(c.opts.AuditPolicy), 0o644); err != nil {
				return fmt.Errorf("start kube-apiserver: write the audit policy: %w", err)
			}
			args = append(args, "--audit-policy-file="+policy, "--audit-log-path="+c.AuditLogPath(),
				"--audit-log-format=json", "--audit-log-mode=blocking", "--audit-log-maxsize=0")
		}
		if c.opts.NodeAuthorizer {
			args = append(args, "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
				// How the API server calls kubelets (logs, exec, port-forward):
				// as the admin, whom a kubelet trusting the cluster CA accepts.
				"--kubelet-client-certificate="+pki.path(adminCertFile),
				"--kubelet-client-key="+pki.path(adminKeyFile))
		} else {
			args = append(args, "--authorization-mode=RBAC")
		}
		p := c.process(KubeAPIServer, c.bins.KubeAPIServer, append(args, c.opts.APIServerArgs...))
		r, err := c.startAndWait(ctx, p, c.Ready)
		if err == nil {
			c.procMu.Lock()
			c.apiProc, c.apiServer = p, r
			c.procMu.Unlock()
		}
		if err == nil || try == portTries || c.opts.APIServerPort != 0 || !portClash(r) {
			if err != nil && c.opts.APIServerPort != 0 && portClash(r) {
				err = fmt.Errorf("%w (%w: 127.0.0.1:%d)", err, ErrPortInUse, port)
			}
			return err
		}
		c.forget(r)
		c.log.Debug("kube-apiserver port taken, retrying", "err", err)
	}
}

func (c *Cluster) startControllerManager(ctx context.Context) error {
	pki := c.pki
	args := []string{
		"--kubeconfig=" + c.Kubeconfig(),
		"--leader-elect=false",
		"--secure-port=0", // no health or metrics endpoint: readiness is checked through the API
		"--use-service-account-credentials=false",
		"--service-account-private-key-file=" + pki.path(saKeyFile),
		"--root-ca-file=" + pki.path(caCertFile),
		"--cluster-signing-cert-file=" + pki.path(caCertFile),
		"--cluster-signing-key-file=" + pki.path(caKeyFile),
		"--service-cluster-ip-range=" + c.opts.ServiceClusterIPRange,
		"--profiling=false",
	}
	p := c.process(KubeControllerManager, c.bins.KubeControllerManager, append(args, c.opts.ControllerManagerArgs...))
	// The ServiceAccount controller creating "default" in the default
	// namespace shows that the controllers run.
	_, err := c.startAndWait(ctx, p, func(ctx context.Context) error {
		_, err := c.clientset.CoreV1().ServiceAccounts(metav1.NamespaceDefault).Get(ctx, "default", metav1.GetOptions{})
		return err
	})
	return err
}

// startAndWait starts p, records it, and polls ready until it returns nil. It
// fails with the tail of p's log if the process exits or ctx ends first. The
// returned process is nil if it could not be started.
func (c *Cluster) startAndWait(ctx context.Context, p Process, ready func(context.Context) error) (*Running, error) {
	began := time.Now()
	c.procMu.Lock()
	if c.stopped.Load() {
		c.procMu.Unlock()
		return nil, fmt.Errorf("start %s: %w", p.Name, ErrClusterStopped)
	}
	r, err := p.Start()
	if err != nil {
		c.procMu.Unlock()
		return nil, err
	}
	c.procs = append(c.procs, r)
	c.procMu.Unlock()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var lastErr error
	for {
		pollCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
		lastErr = ready(pollCtx)
		cancel()
		if lastErr == nil {
			c.log.Debug("component ready", "name", p.Name, "pid", r.Pid(), "took", time.Since(began).Round(time.Millisecond))
			return r, nil
		}
		select {
		case <-r.Done():
			return r, fmt.Errorf("%s exited before it was ready (%v); log %s ends with:\n%s",
				p.Name, r.Err(), p.LogFile, r.LogTail(30))
		case <-ctx.Done():
			_ = r.Stop(c.opts.StopTimeout) // flush its last words into the log
			return r, fmt.Errorf("%s not ready after %s (%w; last check: %v); log %s ends with:\n%s",
				p.Name, time.Since(began).Round(time.Second), context.Cause(ctx), lastErr, p.LogFile, r.LogTail(30))
		case <-tick.C:
		}
	}
}

// forget drops a process that failed to start (and has exited) from the
// cluster's processes.
func (c *Cluster) forget(r *Running) {
	c.procMu.Lock()
	defer c.procMu.Unlock()
	c.procs = slices.DeleteFunc(c.procs, func(p *Running) bool { return p == r })
}

// StopAPIServer stops kube-apiserver alone (SIGTERM, then SIGKILL after
// Options.StopTimeout), leaving etcd and the controller-manager running: an
// outage of the control plane as clients see it. [Cluster.StartAPIServer]
// brings it back with the same port, etcd and certificates. Stopping an API
// server that is already stopped does nothing.
//
// Errors: [ErrClusterStopped]; the pid file cannot be removed.
func (c *Cluster) StopAPIServer() error {
	c.apiMu.Lock()
	defer c.apiMu.Unlock()
	c.procMu.Lock()
	if c.stopped.Load() {
		c.procMu.Unlock()
		return fmt.Errorf("stop kube-apiserver: %w", ErrClusterStopped)
	}
	r := c.apiServer
	c.apiServer = nil
	c.procMu.Unlock()
	if r == nil {
		return nil
	}
	began := time.Now()
	err := r.Stop(c.opts.StopTimeout)
	c.forget(r)
	if c.httpClient != nil {
		utilnet.CloseIdleConnectionsFor(c.httpClient.Transport)
	}
	c.log.Debug("kube-apiserver stopped", "pid", r.Pid(), "took", time.Since(began).Round(time.Millisecond))
	return err
}

// StartAPIServer starts kube-apiserver again after [Cluster.StopAPIServer],
// with the flags, port, etcd and certificates it had, and waits until its
// /readyz is ok, at most Options.StartTimeout. The kubeconfig, the
// RESTConfig and the clientset stay valid: clients made before the outage
// reconnect on their own.
//
// Errors: [ErrClusterStopped]; [ErrAPIServerRunning]; the process exits or is
// not ready in time (with the tail of its log); [ErrPortInUse] when another
// process took the port during the outage.
func (c *Cluster) StartAPIServer(ctx context.Context) error {
	c.apiMu.Lock()
	defer c.apiMu.Unlock()
	c.procMu.Lock()
	switch {
	case c.stopped.Load():
		c.procMu.Unlock()
		return fmt.Errorf("start kube-apiserver: %w", ErrClusterStopped)
	case c.apiServer != nil:
		c.procMu.Unlock()
		return fmt.Errorf("start kube-apiserver: %w", ErrAPIServerRunning)
	case c.apiProc.Path == "":
		c.procMu.Unlock()
		return errors.New("start kube-apiserver: the cluster never started one")
	}
	p := c.apiProc
	c.procMu.Unlock()

	ctx, cancel := context.WithTimeout(ctx, c.opts.StartTimeout)
	defer cancel()
	r, err := c.startAndWait(ctx, p, c.Ready)
	if err != nil {
		if r != nil {
			if portClash(r) {
				err = fmt.Errorf("%w (%w: %s)", err, ErrPortInUse, c.apiURL)
			}
			_ = r.Stop(c.opts.StopTimeout)
			c.forget(r)
		}
		return fmt.Errorf("restart kube-apiserver: %w", err)
	}
	c.procMu.Lock()
	c.apiServer = r
	c.procMu.Unlock()
	return nil
}

// portClash reports whether r failed because its port was taken.
func portClash(r *Running) bool {
	if r == nil {
		return false
	}
	select {
	case <-r.Done():
	case <-time.After(time.Second): // not yet exited: then not a bind error
		return false
	}
	return strings.Contains(r.LogTail(50), "address already in use")
}

func (c *Cluster) newClients() error {
	cfg := &rest.Config{
		Host: c.apiURL,
		TLSClientConfig: rest.TLSClientConfig{
			CAData:   c.pki.caCert,
			CertData: c.pki.adminCert,
			KeyData:  c.pki.adminKey,
		},
		QPS:   200,
		Burst: 400,
	}
	if c.httpClient != nil {
		utilnet.CloseIdleConnectionsFor(c.httpClient.Transport)
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return fmt.Errorf("create client: %w", err)
	}
	cs, err := kubernetes.NewForConfigAndClient(cfg, hc)
	if err != nil {
		return fmt.Errorf("create client: %w", err)
	}
	c.restConfig, c.httpClient, c.clientset = cfg, hc, cs
	return nil
}

func (c *Cluster) writeKubeconfig() error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["cellium"] = &clientcmdapi.Cluster{
		Server:                   c.apiURL,
		CertificateAuthorityData: c.pki.caCert,
	}
	cfg.AuthInfos[adminUser] = &clientcmdapi.AuthInfo{
		ClientCertificateData: c.pki.adminCert,
		ClientKeyData:         c.pki.adminKey,
	}
	cfg.Contexts["cellium"] = &clientcmdapi.Context{Cluster: "cellium", AuthInfo: adminUser}
	cfg.CurrentContext = "cellium"
	if err := clientcmd.WriteToFile(*cfg, c.Kubeconfig()); err != nil {
		return fmt.Errorf("write kubeconfig: %w", err)
	}
	return nil
}

// etcdHealthy asks etcd's /health endpoint.
func etcdHealthy(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/health", nil)
	if err != nil {
		return err
	}
	// A fresh transport without keep-alives: no idle connection outlives the
	// check.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("etcd health: %s", resp.Status)
	}
	return nil
}

// freePorts returns n distinct TCP ports that were free on 127.0.0.1 a moment
// ago.
func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func checkPortFree(port int) error {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return fmt.Errorf("%w: 127.0.0.1:%d is taken by another process; pick another port or stop that process (ss -ltnp 'sport = :%d' shows it): %v",
			ErrPortInUse, port, port, err)
	}
	return l.Close()
}

// checkNotRunning fails with ErrAlreadyRunning if a pid file in dir names a
// running process.
func checkNotRunning(dir string) error {
	pidFiles, err := filepath.Glob(filepath.Join(dir, "*.pid"))
	if err != nil {
		return err
	}
	for _, f := range pidFiles {
		pid, running, err := ReadPidFile(f)
		if err != nil {
			return err
		}
		if running {
			return fmt.Errorf("%w: %s (pid %d) of %s still runs; stop it first (devcluster down --dir %s)",
				ErrAlreadyRunning, strings.TrimSuffix(filepath.Base(f), ".pid"), pid, dir, dir)
		}
	}
	return nil
}
