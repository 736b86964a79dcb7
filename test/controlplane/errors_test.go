package controlplane

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/hive/script"
)

// Bad input to the harness's commands says what was wrong and what to do.
func TestCommandErrors(t *testing.T) {
	h := New(t, nil)
	e := h.Engine()
	dir := t.TempDir()
	s, err := script.NewState(context.Background(), dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.CloseAndWait(&strings.Builder{}) })
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("widget.yaml", "apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: w\n")
	write("ns.yaml", "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: gone\n")
	for _, c := range []struct{ line, want string }{
		{"maps/dump cellium_nosuch", "the maps are cellium_ipcache"},
		{"maps/dump cellium_policy_00009", "no policy map for endpoint 9"},
		{"k8s/add widget.yaml", "is apiVersion/kind a core Kubernetes or cilium.io/v2 kind?"},
		{"k8s/add missing.yaml", "read missing.yaml"},
		{"k8s/delete ns.yaml", "delete Namespace gone"},
		{"endpoint/add web", "want namespace/pod"},
		{"db/cmp k8s-pods pods.table", "use db/show --format=json k8s-pods"},
	} {
		var log strings.Builder
		err := e.ExecuteLine(s, c.line, &log)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one saying %q", c.line, err, c.want)
		}
	}
}
