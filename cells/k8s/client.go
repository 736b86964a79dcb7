package k8s

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"time"

	apiextclientset "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/cellium/cellium/api/client/clientset/versioned"
	"github.com/cellium/cellium/cells/hive"
)

// ErrNotConfigured is returned when no Kubernetes API is configured: no
// --k8s-kubeconfig-path, no --k8s-api-server and not running in a pod.
var ErrNotConfigured = errors.New("no Kubernetes API configured: pass --k8s-kubeconfig-path or --k8s-api-server, or run in a pod")

// Clientset is the Kubernetes client: the core API, cilium.io and
// apiextensions.
type Clientset interface {
	kubernetes.Interface
	// Cilium is the typed client of cilium.io resources.
	Cilium() versioned.Interface
	// APIExtensions manages CRDs.
	APIExtensions() apiextclientset.Interface
	// RESTConfig is the configuration the clients were made with.
	RESTConfig() *rest.Config
	// IsEnabled is false when no API server is configured; the other
	// methods must not be used then.
	IsEnabled() bool
}

type clientset struct {
	*kubernetes.Clientset
	cilium  versioned.Interface
	apiext  apiextclientset.Interface
	config  *rest.Config
	http    *http.Client
	enabled bool
}

func (c *clientset) Cilium() versioned.Interface              { return c.cilium }
func (c *clientset) APIExtensions() apiextclientset.Interface { return c.apiext }
func (c *clientset) RESTConfig() *rest.Config                 { return c.config }
func (c *clientset) IsEnabled() bool                          { return c.enabled }

// RESTConfigFromFlags builds the client configuration from the flags, or
// returns ErrNotConfigured.
func RESTConfigFromFlags(cfg Config, lookupEnv func(string) (string, bool)) (*rest.Config, error) {
	var (
		rc  *rest.Config
		err error
	)
	host, _ := lookupEnv("KUBERNETES_SERVICE_HOST")
	inCluster := host != ""
	switch {
	case cfg.K8sKubeconfigPath != "":
		rc, err = clientcmd.BuildConfigFromFlags(cfg.K8sAPIServer, cfg.K8sKubeconfigPath)
		if err != nil {
			return nil, fmt.Errorf("load --k8s-kubeconfig-path=%s: %w", cfg.K8sKubeconfigPath, err)
		}
	case cfg.K8sAPIServer != "":
		rc = &rest.Config{Host: cfg.K8sAPIServer}
	case inCluster:
		rc, err = rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("in-cluster configuration: %w", err)
		}
	default:
		return nil, ErrNotConfigured
	}
	rc.QPS = cfg.K8sClientQPS
	rc.Burst = cfg.K8sClientBurst
	applyTimeouts(rc, cfg.K8sClientConnectionTimeout, cfg.K8sClientConnectionKeepAlive, cfg.K8sClientRequestTimeout)
	return rc, nil
}

// ClientsetParams are NewClientset's inputs.
type ClientsetParams struct {
	hive.In

	Config    Config
	Lifecycle hive.Lifecycle
	Log       *slog.Logger
	UserAgent UserAgent `optional:"true"`
	// Jobs runs the connection check (optional for callers outside a hive).
	Jobs hive.Jobs `optional:"true"`
}

// UserAgent names the binary in requests ("cellium-agent").
type UserAgent string

// NewClientset creates the clients from the flags. It reads the kubeconfig
// file but contacts nobody, and start does not wait for the API server (a
// job reports in health whether it answers). Without any configuration
// the clientset is disabled.
func NewClientset(p ClientsetParams) (Clientset, error) {
	rc, err := RESTConfigFromFlags(p.Config, os.LookupEnv)
	if errors.Is(err, ErrNotConfigured) {
		p.Log.Info("Kubernetes client disabled", "reason", err)
		return &clientset{}, nil
	}
	if err != nil {
		return nil, err
	}
	if p.UserAgent != "" {
		rc.UserAgent = string(p.UserAgent)
	}
	cs, err := NewClientsetFromConfig(rc)
	if err != nil {
		return nil, err
	}
	// Connections kept alive for reuse (HTTP/2 read loops) end with the
	// hive, not with the process.
	if p.Lifecycle != nil {
		p.Lifecycle.Append(hive.Hook{
			Name: "k8s-client-close-idle",
			OnStop: func(context.Context) error {
				CloseIdleConnections(cs)
				return nil
			},
		})
	}
	// Start does not wait for the API server: the agent must restore its
	// endpoints and serve CNI DEL while the control plane is down. This
	// job reports whether it is reachable; whoever needs the API waits for
	// its tables (or calls WaitForAPIServer).
	if p.Jobs != nil {
		p.Jobs.Add(hive.OneShot("k8s-client-connect", func(ctx context.Context, h hive.Health) error {
			h.Degraded("connecting to the Kubernetes API server "+rc.Host, errors.New("not reached yet"))
			if err := WaitForAPIServer(ctx, cs, p.Log); err != nil {
				return err
			}
			h.OK("connected to " + rc.Host)
			return nil
		}))
	}
	return cs, nil
}

// NewClientsetFromConfig creates an enabled clientset from a REST config.
// The three clients share one HTTP client (one connection pool).
func NewClientsetFromConfig(rc *rest.Config) (Clientset, error) {
	hc, err := rest.HTTPClientFor(rc)
	if err != nil {
		return nil, fmt.Errorf("create Kubernetes HTTP client: %w", err)
	}
	core, err := kubernetes.NewForConfigAndClient(rc, hc)
	if err != nil {
		return nil, fmt.Errorf("create Kubernetes client: %w", err)
	}
	cilium, err := versioned.NewForConfigAndClient(rc, hc)
	if err != nil {
		return nil, fmt.Errorf("create cilium.io client: %w", err)
	}
	apiext, err := apiextclientset.NewForConfigAndClient(rc, hc)
	if err != nil {
		return nil, fmt.Errorf("create apiextensions client: %w", err)
	}
	return &clientset{Clientset: core, cilium: cilium, apiext: apiext, config: rc, http: hc, enabled: true}, nil
}

// CloseIdleConnections closes the idle connections of cs's connection
// pool, looking through the round-tripper wrappers to the transport that
// holds them. The client cell does it at stop; a test that stops a hive
// and checks for leaked goroutines may call it again for a connection
// whose cancelled watches were still closing then.
func CloseIdleConnections(cs Clientset) {
	if c, ok := cs.(*clientset); ok && c.http != nil {
		utilnet.CloseIdleConnectionsFor(c.http.Transport)
	}
}

// WaitForAPIServer retries /version until the API server answers or ctx
// ends.
func WaitForAPIServer(ctx context.Context, cs Clientset, log *slog.Logger) error {
	backoff := 100 * time.Millisecond
	for {
		v, err := cs.Discovery().ServerVersion()
		if err == nil {
			log.Info("connected to Kubernetes API server", "host", cs.RESTConfig().Host, "version", v.GitVersion)
			return nil
		}
		log.Warn("Kubernetes API server not reachable yet", "host", cs.RESTConfig().Host, "error", err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("connect to Kubernetes API server %s: %w", cs.RESTConfig().Host, err)
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// DisabledClientset is a clientset with no API server (IsEnabled is
// false), for agents run without Kubernetes and for tests.
func DisabledClientset() Clientset { return &clientset{} }
