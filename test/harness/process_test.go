package harness

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestProcessStartStop(t *testing.T) {
	// Checked after the cleanups, which stop the process on a failure.
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) })
	dir := t.TempDir()
	p := Process{
		Name:    "sleeper",
		Path:    "/bin/sh",
		Args:    []string{"-c", `echo "started $GREETING"; exec sleep 60`},
		Env:     []string{"GREETING=hi"},
		LogFile: filepath.Join(dir, "sleeper.log"),
		PidFile: filepath.Join(dir, "sleeper.pid"),
	}
	r, err := p.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Stop(time.Second) })
	pid, running, err := ReadPidFile(p.PidFile)
	if err != nil || !running || pid != r.Pid() {
		t.Fatalf("ReadPidFile = %d, %v, %v; want %d, running", pid, running, err, r.Pid())
	}
	waitFor(t, func() bool { return strings.Contains(r.LogTail(5), "started hi") })

	if err := r.Stop(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	select {
	case <-r.Done():
	default:
		t.Fatal("Done not closed after Stop")
	}
	if err := syscall.Kill(r.Pid(), 0); err != syscall.ESRCH {
		t.Errorf("process %d still exists after Stop: %v", r.Pid(), err)
	}
	if _, err := os.Stat(p.PidFile); !os.IsNotExist(err) {
		t.Errorf("pid file left after Stop: %v", err)
	}
	if err := r.Stop(time.Second); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

// TestProcessStopKills covers a process that ignores SIGTERM.
func TestProcessStopKills(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	dir := t.TempDir()
	p := Process{
		Name:    "stubborn",
		Path:    "/bin/sh",
		Args:    []string{"-c", `trap "" TERM; echo trapped; while :; do sleep 0.05; done`},
		LogFile: filepath.Join(dir, "stubborn.log"),
	}
	r, err := p.Start()
	if err != nil {
		t.Fatal(err)
	}
	// The log's first line quotes the command: look for the output line.
	waitFor(t, func() bool { return strings.Contains(r.LogTail(5), "\ntrapped") })
	start := time.Now()
	if err := r.Stop(200 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 200*time.Millisecond || took > 5*time.Second {
		t.Errorf("Stop took %s", took)
	}
	if err := r.Err(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Errorf("exit status = %v, want killed", err)
	}
}

// TestProcessKill: Kill sends SIGKILL without SIGTERM first (a TERM trap
// would print), reaps the process and removes the pid file.
func TestProcessKill(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	dir := t.TempDir()
	p := Process{
		Name:    "victim",
		Path:    "/bin/sh",
		Args:    []string{"-c", `trap "echo got-term" TERM; echo ready; while :; do sleep 0.05; done`},
		LogFile: filepath.Join(dir, "victim.log"),
		PidFile: filepath.Join(dir, "victim.pid"),
	}
	r, err := p.Start()
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return strings.Contains(r.LogTail(5), "\nready") })
	if err := r.Kill(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-r.Done():
	default:
		t.Fatal("Done not closed after Kill")
	}
	if err := r.Err(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Errorf("exit status = %v, want killed", err)
	}
	if strings.Contains(r.LogTail(5), "\ngot-term") { // the first line quotes the command
		t.Error("Kill sent SIGTERM first")
	}
	if _, err := os.Stat(p.PidFile); !os.IsNotExist(err) {
		t.Errorf("pid file left after Kill: %v", err)
	}
	if err := r.Kill(); err != nil {
		t.Errorf("second Kill: %v", err)
	}
	if err := r.Stop(time.Second); err != nil {
		t.Errorf("Stop after Kill: %v", err)
	}
}

// TestPidFileStop stops a detached process through its pid file, as
// devcluster down does from another process.
func TestPidFileStop(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	dir := t.TempDir()
	p := Process{
		Name:    "detached",
		Path:    "/bin/sleep",
		Args:    []string{"60"},
		LogFile: filepath.Join(dir, "detached.log"),
		PidFile: filepath.Join(dir, "detached.pid"),
		Detach:  true,
	}
	r, err := p.Start()
	if err != nil {
		t.Fatal(err)
	}
	if sid := sessionOf(t, r.Pid()); sid != r.Pid() {
		t.Errorf("detached process is in session %d, want its own (%d)", sid, r.Pid())
	}
	if err := StopPidFile(p.PidFile, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	<-r.Done()
	if _, running, _ := ReadPidFile(p.PidFile); running {
		t.Error("still running after StopPidFile")
	}
	if err := StopPidFile(p.PidFile, time.Second); err != nil {
		t.Errorf("StopPidFile again: %v", err)
	}
}

// TestPidFileForeignProcess: a pid file that names a process the harness did
// not start (a recycled pid) reads as not running and is never signalled.
func TestPidFileForeignProcess(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "x.pid")
	writeFile(t, pidFile, "1\n") // init, for sure not ours
	pid, running, err := ReadPidFile(pidFile)
	if err != nil || running || pid != 1 {
		t.Fatalf("ReadPidFile = %d, %v, %v; want 1, not running", pid, running, err)
	}
	if err := StopPidFile(pidFile, time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(pidFile); !os.IsNotExist(err) {
		t.Error("stale pid file not removed")
	}
	if _, running, err := ReadPidFile(filepath.Join(t.TempDir(), "none.pid")); err != nil || running {
		t.Errorf("missing pid file: running=%v err=%v", running, err)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// sessionOf reads the session id of pid from /proc/<pid>/stat.
func sessionOf(t *testing.T, pid int) int {
	t.Helper()
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		t.Fatal(err)
	}
	// pid (comm) state ppid pgrp session ...
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	sid, err := strconv.Atoi(f[3])
	if err != nil {
		t.Fatal(err)
	}
	return sid
}
