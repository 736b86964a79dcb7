package harness

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// PidFileEnv is set in the environment of every process started with a pid
// file, to that file's absolute path. [ReadPidFile] checks it, so a pid that the
// kernel has since given to an unrelated process is never signalled.
const PidFileEnv = "CELLIUM_HARNESS_PIDFILE"

// Process describes one program the harness runs. The harness runs etcd, the
// API server and the controller-manager through it; the devcluster command can
// run more (cellium-operator, cellium-agent, a dev kubelet) the same way.
type Process struct {
	Name    string   // short name ("etcd"), used in errors
	Path    string   // executable
	Args    []string // arguments, without argv[0]
	Env     []string // KEY=VALUE pairs added to the inherited environment
	Dir     string   // working directory; empty means the caller's
	LogFile string   // receives stdout and stderr (appended); required
	PidFile string   // optional: the pid is written here after start and removed by Stop

	// Detach runs the process in a session of its own, so that it outlives the
	// caller (devcluster up). Otherwise the process is killed when the caller
	// dies, so a test binary that panics or times out leaves nothing behind.
	Detach bool
}

// Running is a started [Process].
type Running struct {
	proc Process
	pid  int
	os   *os.Process

	done chan struct{} // closed once the process has exited and been reaped
	err  error         // exit status; read after done

	stopOnce sync.Once
}

// Start starts the process and returns once it runs; it does not wait for the
// program to be ready.
//
// Errors: LogFile is empty or cannot be opened, the executable cannot be
// started, or the pid file cannot be written (the process is then killed).
func (p Process) Start() (*Running, error) {
	if p.LogFile == "" {
		return nil, fmt.Errorf("start %s: no log file", p.Name)
	}
	logf, err := os.OpenFile(p.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", p.Name, err)
	}
	if p.PidFile != "" {
		if p.PidFile, err = filepath.Abs(p.PidFile); err != nil {
			_ = logf.Close()
			return nil, fmt.Errorf("start %s: %w", p.Name, err)
		}
	}
	fmt.Fprintf(logf, "=== %s: %s %s\n", time.Now().Format(time.RFC3339), p.Path, strings.Join(p.Args, " "))

	cmd := exec.Command(p.Path, p.Args...)
	cmd.Dir = p.Dir
	cmd.Env = append(os.Environ(), p.Env...)
	if p.PidFile != "" {
		cmd.Env = append(cmd.Env, PidFileEnv+"="+p.PidFile)
	}
	cmd.Stdout = logf // an *os.File goes straight to the child: no copying goroutine
	cmd.Stderr = logf
	if p.Detach {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	} else {
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	}

	r := &Running{proc: p, done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		// The parent-death signal fires when the thread that forked the child
		// exits, and Go may end a thread that some other goroutine left locked
		// (netns code does). Fork from a thread of our own and keep it until the
		// child has been reaped.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		r.err = cmd.Wait()
		close(r.done)
	}()
	err = <-started
	_ = logf.Close() // the child holds its own copy
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", p.Name, err)
	}
	r.os = cmd.Process
	r.pid = cmd.Process.Pid
	if p.PidFile != "" {
		if err := writeFileAtomic(p.PidFile, []byte(strconv.Itoa(r.pid)+"\n")); err != nil {
			_ = r.Stop(0)
			return nil, fmt.Errorf("start %s: write pid file: %w", p.Name, err)
		}
	}
	return r, nil
}

// Name is the process's [Process.Name].
func (r *Running) Name() string { return r.proc.Name }

// Pid is the process id.
func (r *Running) Pid() int { return r.pid }

// LogFile is the path of the file that receives the process's output.
func (r *Running) LogFile() string { return r.proc.LogFile }

// Done is closed once the process has exited.
func (r *Running) Done() <-chan struct{} { return r.done }

// Err is the exit status once [Running.Done] is closed (nil for exit code 0).
func (r *Running) Err() error {
	select {
	case <-r.done:
		return r.err
	default:
		return nil
	}
}

// LogTail returns the last n lines of the process's log file.
func (r *Running) LogTail(n int) string { return logTail(r.proc.LogFile, n) }

// Stop sends SIGTERM, waits up to timeout for the process to exit, then sends
// SIGKILL and waits for it to be reaped; it removes the pid file. It is safe to
// call more than once and after the process has exited by itself. It returns an
// error only when the pid file cannot be removed.
func (r *Running) Stop(timeout time.Duration) error {
	r.stopOnce.Do(func() {
		select {
		case <-r.done:
			return
		default:
		}
		_ = r.os.Signal(syscall.SIGTERM)
		t := time.NewTimer(timeout)
		defer t.Stop()
		select {
		case <-r.done:
		case <-t.C:
			_ = r.os.Kill()
			<-r.done
		}
	})
	if r.proc.PidFile != "" {
		if err := os.Remove(r.proc.PidFile); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("stop %s: %w", r.proc.Name, err)
		}
	}
	return nil
}

// Kill sends SIGKILL at once (no SIGTERM first: the program gets no chance to
// clean up, as after a crash or an OOM kill), waits for the process to be
// reaped and removes the pid file. Like Stop it is safe to call more than once
// and after the process has exited; a later Stop or Kill does nothing more. It
// returns an error only when the pid file cannot be removed.
func (r *Running) Kill() error {
	r.stopOnce.Do(func() {
		select {
		case <-r.done:
			return
		default:
		}
		_ = r.os.Kill()
		<-r.done
	})
	if r.proc.PidFile != "" {
		if err := os.Remove(r.proc.PidFile); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("kill %s: %w", r.proc.Name, err)
		}
	}
	return nil
}

// ReadPidFile reads a pid file written by [Process.Start] and reports whether
// that process is still running: the pid is alive, not a zombie, and its
// environment names this pid file (see [PidFileEnv]). A missing file is not an
// error: it returns pid 0, not running.
func ReadPidFile(path string) (pid int, running bool, err error) {
	path, err = filepath.Abs(path)
	if err != nil {
		return 0, false, fmt.Errorf("read pid file: %w", err)
	}
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("read pid file: %w", err)
	}
	pid, err = strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 {
		return 0, false, fmt.Errorf("read pid file %s: not a pid: %q", path, data)
	}
	return pid, processOwns(pid, path), nil
}

// StopPidFile stops the process recorded in a pid file written by
// [Process.Start], possibly by another (long gone) command: SIGTERM, up to
// timeout for it to exit, then SIGKILL. It removes the pid file. A missing pid
// file or a process that is not running any more is not an error.
func StopPidFile(path string, timeout time.Duration) error {
	pid, running, err := ReadPidFile(path)
	if err != nil {
		return err
	}
	if running {
		_ = syscall.Kill(pid, syscall.SIGTERM)
		deadline := time.Now().Add(timeout)
		for processOwns(pid, path) {
			if time.Now().After(deadline) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				deadline = time.Now().Add(time.Hour) // kill once, then wait
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("stop process of %s: %w", path, err)
	}
	return nil
}

// processOwns reports whether pid is a live (non-zombie) process whose
// environment carries PidFileEnv=pidFile.
//
// A process in the middle of execve (a shell exec'ing its program) reads
// as an error or an empty environment for a moment: while it still
// exists and is no zombie, the read is retried a few times before the
// answer is "not ours".
func processOwns(pid int, pidFile string) bool {
	var env []byte
	for attempt := 0; ; attempt++ {
		var err error
		env, err = os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if err == nil && len(env) > 0 {
			break
		}
		// gone, or a zombie (whose environ reads as empty anyway)
		if attempt == 4 || syscall.Kill(pid, 0) != nil || isZombie(pid) {
			return false
		}
		time.Sleep(time.Duration(attempt+1) * 5 * time.Millisecond)
	}
	want := []byte(PidFileEnv + "=" + pidFile)
	for kv := range bytes.SplitSeq(env, []byte{0}) {
		if bytes.Equal(kv, want) {
			return !isZombie(pid)
		}
	}
	return false
}

func isZombie(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	// pid (comm) state ...; comm may contain spaces and parentheses.
	i := bytes.LastIndexByte(stat, ')')
	return i < 0 || i+2 >= len(stat) || stat[i+2] == 'Z' || stat[i+2] == 'X'
}

// logTail returns the last n lines of a file (reading at most its last 64 KiB).
func logTail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	defer f.Close()
	const max = 64 << 10
	if fi, err := f.Stat(); err == nil && fi.Size() > max {
		_, _ = f.Seek(-max, io.SeekEnd)
	}
	data, _ := io.ReadAll(f)
	return tailLines(data, n)
}

func writeFileAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-")
	if err != nil {
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close()
		_ = os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		_ = os.Remove(tmp.Name())
		return err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		_ = os.Remove(tmp.Name())
		return err
	}
	return os.Rename(tmp.Name(), path)
}
