package nodeinit

import (
	"os"
	"path/filepath"
	"strings"
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
	dst, installed, err := InstallCNIPlugin(src, dir)
	if err != nil || !installed {
		t.Fatalf("installed %v, %v", installed, err)
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
	// The same plugin again: the file is left alone (same inode).
	before, _ := os.Stat(dst)
	if _, installed, err := InstallCNIPlugin(src, dir); err != nil || installed {
		t.Fatalf("reinstalling the same plugin: installed %v, %v; want left alone", installed, err)
	}
	if after, _ := os.Stat(dst); !os.SameFile(before, after) {
		t.Fatal("the unchanged plugin was replaced")
	}
	// Same content, wrong mode: replaced.
	if err := os.Chmod(dst, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, installed, err := InstallCNIPlugin(src, dir); err != nil || !installed {
		t.Fatalf("plugin of mode 0644: installed %v, %v; want replaced", installed, err)
	}
	// A symbolic link to the same content: replaced by a file.
	if err := os.Remove(dst); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(src, dst); err != nil {
		t.Fatal(err)
	}
	if _, installed, err := InstallCNIPlugin(src, dir); err != nil || !installed {
		t.Fatalf("symbolic link: installed %v, %v; want replaced", installed, err)
	}
	if st, err := os.Lstat(dst); err != nil || !st.Mode().IsRegular() {
		t.Fatalf("after replacing a symbolic link: %v, %v", st, err)
	}
	// A missing source leaves the directory alone.
	if _, _, err := InstallCNIPlugin(filepath.Join(t.TempDir(), "missing"), dir); err == nil {
		t.Fatal("installing a missing plugin succeeded")
	}
}

// The install-cni-plugin command installs every --from into --to-dir.
func TestInstallCNIPluginCommand(t *testing.T) {
	srcDir, dir := t.TempDir(), t.TempDir()
	var args []string
	for _, name := range []string{"cellium-cni", "portmap"} {
		if err := os.WriteFile(filepath.Join(srcDir, name), []byte(name+" binary"), 0o755); err != nil {
			t.Fatal(err)
		}
		args = append(args, "--from="+filepath.Join(srcDir, name))
	}
	for _, want := range []string{"installed", "is up to date"} {
		cmd := Commands()[0]
		var out strings.Builder
		cmd.SetOut(&out)
		cmd.SetArgs(append(args, "--to-dir="+dir))
		if err := cmd.Execute(); err != nil {
			t.Fatal(err)
		}
		if strings.Count(out.String(), want) != 2 {
			t.Fatalf("output %q, want %q twice", out.String(), want)
		}
		for _, name := range []string{"cellium-cni", "portmap"} {
			if b, err := os.ReadFile(filepath.Join(dir, name)); err != nil || string(b) != name+" binary" {
				t.Fatalf("%s: %q, %v", name, b, err)
			}
		}
	}
}
