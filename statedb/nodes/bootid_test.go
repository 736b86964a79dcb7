package nodes

import (
	"os"
	"path/filepath"
	"testing"
)

func TestReadBootID(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good")
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(good, []byte("0f1e2d3c-aaaa-bbbb-cccc-0123456789ab\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(empty, []byte("\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if id, err := ReadBootID(good); err != nil || id != "0f1e2d3c-aaaa-bbbb-cccc-0123456789ab" {
		t.Errorf("ReadBootID = %q, %v", id, err)
	}
	if _, err := ReadBootID(empty); err == nil {
		t.Error("empty file: no error")
	}
	if _, err := ReadBootID(filepath.Join(dir, "missing")); err == nil {
		t.Error("missing file: no error")
	}
	if _, err := os.Stat(BootIDPath); err == nil {
		if id, err := ReadBootID(BootIDPath); err != nil || len(id) != 36 {
			t.Errorf("this kernel's boot ID: %q, %v", id, err)
		}
	}
}
