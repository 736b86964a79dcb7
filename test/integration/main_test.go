// Package integration runs cellium's binaries and cells against a real
// kube-apiserver and etcd started by the test harness.
package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cellium/cellium/test/harness"
)

var (
	cluster = harness.NewShared(harness.Options{})

	binOnce sync.Once
	binDir  string
	binErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if err := cluster.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// binaries builds cellium-agent and cellium-operator once per test run.
func binaries(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("", "cellium-bin-")
		if binErr != nil {
			return
		}
		binErr = harness.BuildCellium(context.Background(), binDir)
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binDir
}

// process is a cellium binary running as a child process.
type process struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan error
}

func startDaemon(t *testing.T, name string, env []string, args ...string) *process {
	t.Helper()
	log := filepath.Join(t.TempDir(), name+".log")
	f, err := os.Create(log)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(binaries(t), name), args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	d := &process{name: name, cmd: cmd, log: log, done: make(chan error, 1)}
	go func() { d.done <- cmd.Wait(); f.Close() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-d.done
		}
		if t.Failed() {
			t.Logf("--- %s log ---\n%s", name, d.tail())
		}
	})
	return d
}

func (d *process) tail() string {
	b, _ := os.ReadFile(d.log)
	if len(b) > 8000 {
		b = b[len(b)-8000:]
	}
	return string(b)
}

// sigterm sends SIGTERM and returns how long the process took to exit.
func (d *process) sigterm(t *testing.T) time.Duration {
	t.Helper()
	t0 := time.Now()
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("signal %s: %v", d.name, err)
	}
	select {
	case err := <-d.done:
		if err != nil {
			t.Fatalf("%s exited with %v after SIGTERM\n%s", d.name, err, d.tail())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not exit 30s after SIGTERM\n%s", d.name, d.tail())
	}
	return time.Since(t0)
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// unixClient talks HTTP to a unix socket.
func unixClient(socket string) *http.Client {
	return &http.Client{
		Timeout: 5 * time.Second,
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		}},
	}
}

func getJSON(c *http.Client, url string, out any) error {
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	return json.Unmarshal(body, out)
}

func eventually(t *testing.T, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s: %v", timeout, what, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
