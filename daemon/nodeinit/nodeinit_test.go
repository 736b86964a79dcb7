package nodeinit

import (
	"os"
	"path/filepath"
	"testing"
)

func TestInstallCNIPlugin(t *testing.T) {
	src := filepath.Join(t.TempDir(), "cellium-cni")
	if err := os.WriteFile(src, []byte("new plugin"), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "opt", "cni", "bin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// An old plugin is replaced.
	if err := os.WriteFile(filepath.Join(dir, "cellium-cni"), []byte("old"), 0o755); err != nil {
		t.Fatal(err)
	}
	dst, err := InstallCNIPlugin(src, dir)
	if err != nil {
		t.Fatal(err)
	}
	if dst != filepath.Join(dir, "cellium-cni") {
		t.Fatalf("installed at %s", dst)
	}
	b, err := os.ReadFile(dst)
	if err != nil || string(b) != "new plugin" {
		t.Fatalf("installed plugin holds %q (%v)", b, err)
	}
	st, err := os.Stat(dst)
	if err != nil || st.Mode().Perm() != 0o755 {
		t.Fatalf("installed plugin mode %v (%v), want 0755", st.Mode(), err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("directory holds %d files, want the plugin alone (no temporary file left)", len(entries))
	}
	// A missing source leaves the directory alone.
	if _, err := InstallCNIPlugin(filepath.Join(t.TempDir(), "missing"), dir); err == nil {
		t.Fatal("installing a missing plugin succeeded")
	}
}
