package statedir_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
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

// lockHelperEnv makes the test binary a helper process that holds the
// lock of the named directory until its stdin closes.
const lockHelperEnv = "CELLIUM_TEST_LOCK_HELPER_DIR"

func TestMain(m *testing.M) {
	if dir := os.Getenv(lockHelperEnv); dir != "" {
		if err := statedir.NewLock(dir).Acquire(); err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Println("locked")
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestLockAcrossProcesses: another process's lock names that process, and
// the kernel releases it when that process is killed (a crashed agent
// leaves no lock behind).
func TestLockAcrossProcesses(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), lockHelperEnv+"="+dir)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "locked\n" {
		t.Fatalf("helper said %q (%v)", line, err)
	}
	err = statedir.NewLock(dir).Acquire()
	if !errors.Is(err, statedir.ErrLocked) || !strings.Contains(err.Error(), "locked by process "+strconv.Itoa(cmd.Process.Pid)) {
		t.Fatalf("Acquire while the helper holds the lock = %v, want ErrLocked naming PID %d", err, cmd.Process.Pid)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	l := statedir.NewLock(dir)
	if err := l.Acquire(); err != nil {
		t.Fatalf("Acquire after the holder was killed: %v", err)
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
}
