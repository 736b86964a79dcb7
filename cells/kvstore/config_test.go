package kvstore

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
)

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		args []string
		err  string // "" = valid
	}{
		{nil, ""},
		{[]string{"--kvstore=etcd", "--kvstore-opt=etcd.address=http://127.0.0.1:2379"}, ""},
		{[]string{"--kvstore=etcd", "--kvstore-opt=etcd.config=/x.yaml", "--kvstore-lease-ttl=25s"}, ""},
		{[]string{"--kvstore=consul", "--kvstore-opt=etcd.address=http://x"}, `invalid --kvstore="consul"`},
		{[]string{"--kvstore=etcd"}, "needs the etcd endpoints"},
		{[]string{"--kvstore-opt=etcd.config=/x.yaml"}, "given without --kvstore"},
		{[]string{"--kvstore=etcd", "--kvstore-opt=etcd.bogus=1,etcd.address=http://x"}, `unknown --kvstore-opt "etcd.bogus"`},
		{[]string{"--kvstore=etcd", "--kvstore-opt=etcd.address=http://x", "--kvstore-lease-ttl=10s"}, "invalid --kvstore-lease-ttl=10s"},
		{[]string{"--kvstore=etcd", "--kvstore-opt=etcd.address=http://x", "--kvstore-lease-ttl=25h"}, "invalid --kvstore-lease-ttl"},
	} {
		var got Config
		h := hivetest.New(t, tc.args, hive.Config(DefaultConfig), hivetest.Capture(&got))
		err := h.Populate()
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%v: %v", tc.args, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%v: got %v, want %q", tc.args, err, tc.err)
		}
	}
	if DefaultConfig.KVStoreLeaseTTL != 15*time.Minute {
		t.Errorf("default lease TTL %s, want Cilium's 15m", DefaultConfig.KVStoreLeaseTTL)
	}
}

func TestEtcdConfigFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "etcd.config")
	// Cilium's etcd.config, as its Helm chart writes it.
	if err := os.WriteFile(path, []byte("---\nendpoints:\n- http://127.0.0.1:2379\n- http://127.0.0.2:2379\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := EtcdConfig(map[string]string{OptConfig: path})
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Endpoints) != 2 || cfg.Endpoints[1] != "http://127.0.0.2:2379" || cfg.TLS != nil {
		t.Errorf("endpoints %v, TLS %v", cfg.Endpoints, cfg.TLS)
	}
	// TLS files that do not exist: a clear error at start.
	if err := os.WriteFile(path, []byte("endpoints: [https://e:2379]\ntrusted-ca-file: /nonexistent/ca.crt\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := EtcdConfig(map[string]string{OptConfig: path}); err == nil || !strings.Contains(err.Error(), "etcd.config") {
		t.Errorf("missing CA file: %v", err)
	}
	if err := os.WriteFile(path, []byte("endpoints: []\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := EtcdConfig(map[string]string{OptConfig: path}); err == nil || !strings.Contains(err.Error(), "no etcd endpoints") {
		t.Errorf("no endpoints: %v", err)
	}
	if _, err := EtcdConfig(map[string]string{OptConfig: filepath.Join(dir, "missing")}); err == nil {
		t.Error("missing file accepted")
	}
}

func TestParseLabelsKey(t *testing.T) {
	for v, ok := range map[string]bool{
		"k8s:app=web;k8s:io.kubernetes.pod.namespace=default;": true,
		"reserved:host=;":  true,
		"":                 false,
		"k8s:app=web":      false, // no trailing ";"
		"garbage;":         false,
		"\x00\xff;":        false,
		"k8s:b=1;k8s:a=2;": false, // not sorted: not what Cilium writes
	} {
		if _, got := ParseLabelsKey([]byte(v)); got != ok {
			t.Errorf("ParseLabelsKey(%q) = %v, want %v", v, got, ok)
		}
	}
}
