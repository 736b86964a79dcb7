package identity

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/statedb/labels"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name   string
		change func(*Config)
		flag   string // "" = valid
	}{
		{"defaults", func(*Config) {}, ""},
		{"cluster 1 of 511", func(c *Config) { c.ClusterID, c.MaxConnectedClusters = 1, 511 }, ""},
		{"kvstore", func(c *Config) { c.IdentityAllocationMode = "kvstore" }, ""},
		{"doublewrite-readkvstore", func(c *Config) { c.IdentityAllocationMode = "doublewrite-readkvstore" }, ""},
		{"doublewrite-readcrd", func(c *Config) { c.IdentityAllocationMode = "doublewrite-readcrd" }, ""},
		{"doublewrite, no read side", func(c *Config) { c.IdentityAllocationMode = "doublewrite" }, "--identity-allocation-mode"},
		{"unknown mode", func(c *Config) { c.IdentityAllocationMode = "consul" }, "--identity-allocation-mode"},
		{"no timeout", func(c *Config) { c.IdentityAllocationTimeout = 0 }, "--identity-allocation-timeout"},
		{"upper-case cluster", func(c *Config) { c.ClusterName = "Prod" }, "--cluster-name"},
		{"empty cluster", func(c *Config) { c.ClusterName = "" }, "--cluster-name"},
		{"dash at the end", func(c *Config) { c.ClusterName = "prod-" }, "--cluster-name"},
		{"long cluster", func(c *Config) { c.ClusterName = strings.Repeat("a", 33) }, "--cluster-name"},
		{"cluster id too big", func(c *Config) { c.ClusterID = 256 }, "--cluster-id"},
		{"max clusters", func(c *Config) { c.MaxConnectedClusters = 100 }, "--max-connected-clusters"},
		{"bad label rule", func(c *Config) { c.Labels = []string{"k8s:("} }, "--labels"},
	}
	for _, tt := range tests {
		c := DefaultConfig
		tt.change(&c)
		err := c.Validate()
		switch {
		case tt.flag == "" && err != nil:
			t.Errorf("%s: %v", tt.name, err)
		case tt.flag != "" && (err == nil || !strings.Contains(err.Error(), tt.flag)):
			t.Errorf("%s: error %v, want one naming %s", tt.name, err, tt.flag)
		}
	}
}

// The flags reach the graph: the label filter others use and the cluster
// name.
func TestFilterAndClusterNameFromFlags(t *testing.T) {
	prefixFile := filepath.Join(t.TempDir(), "prefixes.json")
	if err := os.WriteFile(prefixFile, []byte(`{"version":1,"valid-prefixes":[
		{"source":"k8s","prefix":"io.kubernetes.pod.namespace"},{"source":"k8s","prefix":"tier"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	pod := labels.FromK8sPod(map[string]string{"app": "web", "tier": "front", "pod-template-hash": "abc"},
		"prod", nil, "sa", "")
	tests := []struct {
		args []string
		want string
		name ClusterName
	}{
		{nil, "k8s:app=web,k8s:io.cilium.k8s.policy.cluster=default,k8s:io.cilium.k8s.policy.serviceaccount=sa,k8s:io.kubernetes.pod.namespace=prod,k8s:tier=front", "default"},
		// Allow-list mode: app, and what the default rules include; not tier.
		{[]string{"--labels=k8s:app", "--cluster-name=east"}, "k8s:app=web,k8s:io.cilium.k8s.policy.cluster=default,k8s:io.cilium.k8s.policy.serviceaccount=sa,k8s:io.kubernetes.pod.namespace=prod", "east"},
		{[]string{"--label-prefix-file=" + prefixFile}, "k8s:io.kubernetes.pod.namespace=prod,k8s:tier=front", "default"},
	}
	for _, tt := range tests {
		var (
			f    LabelFilter
			name ClusterName
		)
		err := hivetest.New(t, tt.args, hive.Module("identity-allocator", "Config only",
			hive.Config(DefaultConfig), hive.Provide(newLabelFilter, newClusterName)),
			hivetest.Capture(&f), hivetest.Capture(&name)).Populate()
		if err != nil {
			t.Fatalf("%v: %v", tt.args, err)
		}
		if id, _ := f.Split(pod); id.String() != tt.want {
			t.Errorf("%v: identity labels %s, want %s", tt.args, id, tt.want)
		}
		if name != tt.name {
			t.Errorf("%v: cluster name %q, want %q", tt.args, name, tt.name)
		}
	}

	h := hivetest.New(t, []string{"--label-prefix-file=/nonexistent"}, hive.Module("identity-allocator", "Config only",
		hive.Config(DefaultConfig), hive.Provide(newLabelFilter)), hive.Invoke(func(LabelFilter) {}))
	if err := h.Populate(); err == nil || !strings.Contains(err.Error(), "--label-prefix-file") {
		t.Errorf("missing prefix file: %v", err)
	}
}
