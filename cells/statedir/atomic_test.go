package statedir

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestWriteFileSyncsFileAndDirectory(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	var synced []string
	sync := func(f *os.File) error {
		synced = append(synced, f.Name())
		return f.Sync()
	}
	if err := writeFile(path, []byte("one"), 0o600, sync); err != nil {
		t.Fatal(err)
	}
	if len(synced) != 2 || !IsTemp(filepath.Base(synced[0])) || synced[1] != dir {
		t.Fatalf("synced %q, want the temporary file, then %s", synced, dir)
	}
	got, err := os.ReadFile(path)
	if err != nil || string(got) != "one" {
		t.Fatalf("content %q, %v", got, err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, %v", fi.Mode(), err)
	}
	// A second write replaces the content; no temporary file is left.
	if err := WriteFile(path, []byte("two"), 0o600); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(dir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if !slices.Equal(names, []string{"state.json"}) {
		t.Fatalf("directory holds %q", names)
	}
}

func TestWriteFileSyncFailureKeepsOldContent(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	if err := WriteFile(path, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("disk gone")
	err := writeFile(path, []byte("new"), 0o600, func(*os.File) error { return boom })
	if !errors.Is(err, boom) {
		t.Fatalf("error %v, want %v", err, boom)
	}
	got, _ := os.ReadFile(path)
	if string(got) != "old" {
		t.Fatalf("content %q after a failed sync, want the old one", got)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("a temporary file was left: %v", entries)
	}
}

func TestIsTemp(t *testing.T) {
	for name, want := range map[string]bool{
		".allocations.json.tmp-123": true,
		".12.json.tmp-9":            true,
		"12.json":                   false,
		"12.json.tmp-1":             false,
		".hidden":                   false,
	} {
		if IsTemp(name) != want {
			t.Errorf("IsTemp(%q) = %v", name, !want)
		}
	}
}
