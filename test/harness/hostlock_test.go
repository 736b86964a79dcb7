package harness

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// lockHolderEnv makes the test binary a process that takes the lock named
// by it, says "held" and waits to be killed (TestHostLockAcrossProcesses).
const lockHolderEnv = "CELLIUM_TEST_LOCK_HOLDER"

func TestMain(m *testing.M) {
	if name := os.Getenv(lockHolderEnv); name != "" {
		if _, err := lockAbstract(context.Background(), name, func() {}); err != nil {
			fmt.Println(err)
			os.Exit(1)
		}
		fmt.Println("held")
		time.Sleep(time.Hour)
	}
	os.Exit(m.Run())
}

// testLockName is an abstract socket of the test's own: the host network's
// lock may be held by another test package meanwhile.
func testLockName(t *testing.T) string {
	return fmt.Sprintf("@cellium-test-lock-%d-%s", os.Getpid(), t.Name())
}

func TestHostLockExcludes(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	name := testLockName(t)
	unlock, err := lockAbstract(t.Context(), name, func() { t.Error("waited for a free lock") })
	if err != nil {
		t.Fatal(err)
	}
	waited := false
	ctx, cancel := context.WithTimeout(t.Context(), 600*time.Millisecond)
	defer cancel()
	if _, err := lockAbstract(ctx, name, func() { waited = true }); err == nil {
		t.Fatal("a second holder took the lock while the first held it")
	}
	if !waited {
		t.Error("the second taker did not say it waits")
	}
	unlock()
	again, err := lockAbstract(t.Context(), name, func() { t.Error("waited after the release") })
	if err != nil {
		t.Fatalf("after the release: %v", err)
	}
	again()
}

// TestHostLockAcrossProcesses: another process holding the lock keeps this
// one out, and its death by SIGKILL (no clean-up code runs) frees it.
func TestHostLockAcrossProcesses(t *testing.T) {
	name := testLockName(t)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), lockHolderEnv+"="+name)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if strings.TrimSpace(line) != "held" {
		t.Fatalf("holder said %q (%v)", line, err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 600*time.Millisecond)
	defer cancel()
	if _, err := lockAbstract(ctx, name, func() {}); err == nil {
		t.Fatal("took the lock another process holds")
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	ctx, cancel = context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	unlock, err := lockAbstract(ctx, name, func() {})
	if err != nil {
		t.Fatalf("the lock of a SIGKILLed holder: %v", err)
	}
	unlock()
}
