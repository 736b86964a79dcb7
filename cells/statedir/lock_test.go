package statedir_test

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/cellium/cellium/cells/statedir"
)

func TestLockIsExclusiveAndNamesTheHolder(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	a := statedir.NewLock(dir)
	if err := a.Acquire(); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, statedir.LockFileName))
	if err != nil || strings.TrimSpace(string(data)) != strconv.Itoa(os.Getpid()) {
		t.Fatalf("lock file holds %q (%v), want our PID", data, err)
	}
	b := statedir.NewLock(dir)
	err = b.Acquire()
	if !errors.Is(err, statedir.ErrLocked) {
		t.Fatalf("second Acquire = %v, want ErrLocked", err)
	}
	for _, want := range []string{"locked by process " + strconv.Itoa(os.Getpid()), "--state-dir"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if err := a.Release(); err != nil {
		t.Fatal(err)
	}
	if err := b.Acquire(); err != nil {
		t.Fatalf("Acquire after Release: %v", err)
	}
	if err := b.Release(); err != nil {
		t.Fatal(err)
	}
}

func TestLockRefusesSymlink(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "target")
	if err := os.WriteFile(target, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(dir, statedir.LockFileName)); err != nil {
		t.Fatal(err)
	}
	if err := statedir.NewLock(dir).Acquire(); err == nil {
		t.Fatal("Acquire followed a symlinked lock file")
	}
	if data, _ := os.ReadFile(target); string(data) != "keep" {
		t.Errorf("the symlink's target was changed to %q", data)
	}
}
