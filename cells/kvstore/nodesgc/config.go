package nodesgc

import (
	"fmt"
	"strings"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/labels"
)

// Flag names (Cilium's).
const (
	FlagEnable          = "synchronize-k8s-nodes"
	FlagClusterName     = "cluster-name"
	FlagCiliumPodLabels = "cilium-pod-labels"
)

// Config is the collector's configuration.
type Config struct {
	// SynchronizeK8sNodes turns the collector on (with --kvstore).
	SynchronizeK8sNodes bool
	// ClusterName is the cluster whose node keys are collected
	// (cilium/state/nodes/v1/<ClusterName>/); the agents' --cluster-name.
	ClusterName string
	// CiliumPodLabels selects the agent pods: while one runs on a node
	// (phase neither Succeeded nor Failed), its key is kept.
	CiliumPodLabels string
}

// DefaultConfig has Cilium's defaults, except that the agent pods are
// selected by the labels cellium's chart gives them (Cilium's default is
// k8s-app=cilium).
var DefaultConfig = Config{
	SynchronizeK8sNodes: true,
	ClusterName:         "default",
	CiliumPodLabels:     "app.kubernetes.io/name=cellium,app.kubernetes.io/component=agent",
}

// Flags registers the collector's flags.
func (def Config) Flags(fs *pflag.FlagSet) {
	fs.Bool(FlagEnable, def.SynchronizeK8sNodes,
		"Delete the kvstore node keys (cilium/state/nodes/v1/<cluster>/<node>) of nodes that have no CiliumNode (with --kvstore)")
	fs.String(FlagClusterName, def.ClusterName, "Name of the cluster; only its node keys are collected (the agents' --cluster-name)")
	fs.String(FlagCiliumPodLabels, def.CiliumPodLabels,
		"Label selector of the agent pods; the node key of a node where one runs is kept")
}

// Validate checks the cluster name and the selector.
func (c Config) Validate() error {
	if c.ClusterName == "" || strings.Contains(c.ClusterName, "/") {
		return fmt.Errorf("invalid --%s=%q: give the agents' --cluster-name (not empty, no '/')", FlagClusterName, c.ClusterName)
	}
	if _, err := labels.Parse(c.CiliumPodLabels); err != nil {
		return fmt.Errorf("invalid --%s=%q: %w", FlagCiliumPodLabels, c.CiliumPodLabels, err)
	}
	return nil
}
