package k8s

import (
	"fmt"
	"time"

	"github.com/spf13/pflag"
)

// Config is the Kubernetes client's configuration. The flag names are
// Cilium's.
type Config struct {
	// K8sAPIServer is the API server URL; it overrides the kubeconfig's.
	K8sAPIServer string
	// K8sKubeconfigPath is the kubeconfig file; empty means in-cluster.
	K8sKubeconfigPath string
	// K8sClientQPS and K8sClientBurst limit the request rate.
	K8sClientQPS   float32
	K8sClientBurst int
	// K8sClientConnectionTimeout bounds connecting to the API server, and
	// K8sClientConnectionKeepAlive is the TCP keep-alive period (Cilium's
	// flags and defaults).
	K8sClientConnectionTimeout   time.Duration
	K8sClientConnectionKeepAlive time.Duration
	// K8sClientRequestTimeout bounds every request but watches, so that
	// what needs the API (a CNI ADD for new labels) fails in bounded time
	// while the API server is down.
	K8sClientRequestTimeout time.Duration
}

// DefaultConfig has Cilium's client rate limits and connection timeouts.
var DefaultConfig = Config{
	K8sClientQPS: 10, K8sClientBurst: 20,
	K8sClientConnectionTimeout: 30 * time.Second, K8sClientConnectionKeepAlive: 30 * time.Second,
	K8sClientRequestTimeout: 10 * time.Second,
}

// Flags registers the client flags.
func (def Config) Flags(fs *pflag.FlagSet) {
	fs.String("k8s-api-server", def.K8sAPIServer, "Kubernetes API server URL (overrides the kubeconfig's)")
	fs.String("k8s-kubeconfig-path", def.K8sKubeconfigPath, "Absolute path of the kubeconfig file (empty: in-cluster configuration)")
	fs.Float32("k8s-client-qps", def.K8sClientQPS, "Queries per second limit for the Kubernetes client")
	fs.Int("k8s-client-burst", def.K8sClientBurst, "Burst value allowed for the Kubernetes client")
	fs.Duration("k8s-client-connection-timeout", def.K8sClientConnectionTimeout, "Maximum time to connect to the Kubernetes API server")
	fs.Duration("k8s-client-connection-keep-alive", def.K8sClientConnectionKeepAlive, "TCP keep-alive period of connections to the Kubernetes API server")
	fs.Duration("k8s-client-request-timeout", def.K8sClientRequestTimeout, "Maximum duration of a Kubernetes API request (watches excepted); 0 means none")
}

// Validate checks the rate limits.
func (c Config) Validate() error {
	if c.K8sClientQPS <= 0 {
		return fmt.Errorf("invalid value %v for --k8s-client-qps: must be greater than 0", c.K8sClientQPS)
	}
	if c.K8sClientBurst <= 0 {
		return fmt.Errorf("invalid value %d for --k8s-client-burst: must be greater than 0", c.K8sClientBurst)
	}
	if c.K8sClientConnectionTimeout < 0 || c.K8sClientConnectionKeepAlive < 0 || c.K8sClientRequestTimeout < 0 {
		return fmt.Errorf("invalid --k8s-client-connection-timeout=%v, --k8s-client-connection-keep-alive=%v or --k8s-client-request-timeout=%v: must not be negative",
			c.K8sClientConnectionTimeout, c.K8sClientConnectionKeepAlive, c.K8sClientRequestTimeout)
	}
	return nil
}

// OperatorConfig is the operator's client configuration. Cilium's
// operator has its own rate limit flags, --operator-k8s-client-qps and
// --operator-k8s-client-burst (100 and 200: it writes for the whole
// cluster, the CiliumEndpointSlices among it), and the agent's names for
// the rest.
type OperatorConfig struct {
	K8sAPIServer                 string
	K8sKubeconfigPath            string
	OperatorK8sClientQPS         float32
	OperatorK8sClientBurst       int
	K8sClientConnectionTimeout   time.Duration
	K8sClientConnectionKeepAlive time.Duration
	K8sClientRequestTimeout      time.Duration
}

// DefaultOperatorConfig has Cilium's operator client rate limits and the
// agent's connection timeouts.
var DefaultOperatorConfig = OperatorConfig{
	OperatorK8sClientQPS: 100, OperatorK8sClientBurst: 200,
	K8sClientConnectionTimeout:   DefaultConfig.K8sClientConnectionTimeout,
	K8sClientConnectionKeepAlive: DefaultConfig.K8sClientConnectionKeepAlive,
	K8sClientRequestTimeout:      DefaultConfig.K8sClientRequestTimeout,
}

// Flags registers the operator's client flags.
func (def OperatorConfig) Flags(fs *pflag.FlagSet) {
	own := pflag.NewFlagSet("", pflag.ContinueOnError)
	def.ClientConfig().Flags(own)
	own.VisitAll(func(f *pflag.Flag) {
		switch f.Name {
		case "k8s-client-qps", "k8s-client-burst":
		default:
			fs.AddFlag(f)
		}
	})
	fs.Float32("operator-k8s-client-qps", def.OperatorK8sClientQPS, "Queries per second limit for the operator's Kubernetes client")
	fs.Int("operator-k8s-client-burst", def.OperatorK8sClientBurst, "Burst value allowed for the operator's Kubernetes client")
}

// Validate checks the rate limits and timeouts.
func (c OperatorConfig) Validate() error {
	if c.OperatorK8sClientQPS <= 0 {
		return fmt.Errorf("invalid value %v for --operator-k8s-client-qps: must be greater than 0", c.OperatorK8sClientQPS)
	}
	if c.OperatorK8sClientBurst <= 0 {
		return fmt.Errorf("invalid value %d for --operator-k8s-client-burst: must be greater than 0", c.OperatorK8sClientBurst)
	}
	return c.ClientConfig().Validate()
}

// ClientConfig is c as the client takes it.
func (c OperatorConfig) ClientConfig() Config {
	return Config{
		K8sAPIServer: c.K8sAPIServer, K8sKubeconfigPath: c.K8sKubeconfigPath,
		K8sClientQPS: c.OperatorK8sClientQPS, K8sClientBurst: c.OperatorK8sClientBurst,
		K8sClientConnectionTimeout:   c.K8sClientConnectionTimeout,
		K8sClientConnectionKeepAlive: c.K8sClientConnectionKeepAlive,
		K8sClientRequestTimeout:      c.K8sClientRequestTimeout,
	}
}
