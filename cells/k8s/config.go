package k8s

import (
	"fmt"

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
}

// DefaultConfig has Cilium's client rate limits.
var DefaultConfig = Config{K8sClientQPS: 10, K8sClientBurst: 20}

// Flags registers the client flags.
func (def Config) Flags(fs *pflag.FlagSet) {
	fs.String("k8s-api-server", def.K8sAPIServer, "Kubernetes API server URL (overrides the kubeconfig's)")
	fs.String("k8s-kubeconfig-path", def.K8sKubeconfigPath, "Absolute path of the kubeconfig file (empty: in-cluster configuration)")
	fs.Float32("k8s-client-qps", def.K8sClientQPS, "Queries per second limit for the Kubernetes client")
	fs.Int("k8s-client-burst", def.K8sClientBurst, "Burst value allowed for the Kubernetes client")
}

// Validate checks the rate limits.
func (c Config) Validate() error {
	if c.K8sClientQPS <= 0 {
		return fmt.Errorf("invalid value %v for --k8s-client-qps: must be greater than 0", c.K8sClientQPS)
	}
	if c.K8sClientBurst <= 0 {
		return fmt.Errorf("invalid value %d for --k8s-client-burst: must be greater than 0", c.K8sClientBurst)
	}
	return nil
}
