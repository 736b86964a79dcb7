package plugin

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestLogFileRefusesSymlink: a log-file path that is a symlink (planted by
// whoever can write the log directory) is not followed; the plugin logs to
// stderr instead and the link's target is untouched.
func TestLogFileRefusesSymlink(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "shadow")
	if err := os.WriteFile(target, []byte("root:x:0:0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, "cni.log")
	if err := os.Symlink(target, logPath); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	p := &Plugin{Stderr: &stderr}
	log, closeLog := p.logger(&NetConf{LogFile: logPath})
	log.Warn("hello from the test")
	closeLog()
	if data, _ := os.ReadFile(target); string(data) != "root:x:0:0\n" {
		t.Errorf("the symlink's target was written: %q", data)
	}
	if !strings.Contains(stderr.String(), "is a symbolic link") || !strings.Contains(stderr.String(), "hello from the test") {
		t.Errorf("stderr %q: want the refusal and the log line", stderr.String())
	}
}

func TestLogFileRefusesFIFO(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	if f, err := openLogFile(path); err == nil {
		f.Close()
		t.Fatal("openLogFile opened a FIFO")
	}
}

func TestLogFileAppends(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cni.log")
	for _, msg := range []string{"one", "two"} {
		log, closeLog := (&Plugin{}).logger(&NetConf{LogFile: path})
		log.Info(msg)
		closeLog()
	}
	data, err := os.ReadFile(path)
	if err != nil || !strings.Contains(string(data), "msg=one") || !strings.Contains(string(data), "msg=two") {
		t.Fatalf("log %q (%v): want both lines", data, err)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Errorf("log mode %v, want 0600", fi.Mode())
	}
}
