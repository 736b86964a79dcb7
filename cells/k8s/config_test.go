package k8s

import (
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

// The operator's client takes Cilium's operator flags and defaults
// (--operator-k8s-client-qps 100, --operator-k8s-client-burst 200) and
// refuses what the agent's would.
func TestOperatorConfig(t *testing.T) {
	if c := DefaultOperatorConfig.ClientConfig(); c.K8sClientQPS != 100 || c.K8sClientBurst != 200 ||
		c.K8sClientRequestTimeout != DefaultConfig.K8sClientRequestTimeout {
		t.Errorf("default operator client config %+v", c)
	}
	fs := pflag.NewFlagSet("", pflag.ContinueOnError)
	DefaultOperatorConfig.Flags(fs)
	for _, name := range []string{"operator-k8s-client-qps", "operator-k8s-client-burst", "k8s-kubeconfig-path", "k8s-client-request-timeout"} {
		if fs.Lookup(name) == nil {
			t.Errorf("no --%s", name)
		}
	}
	for _, name := range []string{"k8s-client-qps", "k8s-client-burst"} {
		if fs.Lookup(name) != nil {
			t.Errorf("the operator has the agent's --%s", name)
		}
	}
	bad := DefaultOperatorConfig
	bad.OperatorK8sClientQPS = 0
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "--operator-k8s-client-qps") {
		t.Errorf("qps 0: %v", err)
	}
	bad = DefaultOperatorConfig
	bad.OperatorK8sClientBurst = -1
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "--operator-k8s-client-burst") {
		t.Errorf("burst -1: %v", err)
	}
	bad = DefaultOperatorConfig
	bad.K8sClientRequestTimeout = -time.Second
	if err := bad.Validate(); err == nil {
		t.Error("a negative request timeout passes")
	}
}
