package statedir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// LockFileName is the file in the state directory that the running agent
// holds an exclusive lock (flock) on and that records its process ID.
const LockFileName = "agent.lock"

// ErrLocked is returned by Lock.Acquire when another process holds the
// state directory.
var ErrLocked = errors.New("state directory is in use by another process")

// Lock is the exclusive lock of one agent on a state directory: two agents
// on one node would share endpoint state and the API socket, and the
// second would undo what the first does. The kernel releases the lock when
// the process dies, so a crashed agent never leaves the directory locked.
type Lock struct {
	dir string
	f   *os.File
}

// NewLock returns the (not yet acquired) lock of dir.
func NewLock(dir string) *Lock { return &Lock{dir: dir} }

// Acquire creates the directory (0750) if needed, locks it, and writes this
// process's ID into the lock file.
//
// Errors: one wrapping ErrLocked, naming the holder's process ID, when
// another process holds the lock; file system errors.
func (l *Lock) Acquire() error {
	if err := os.MkdirAll(l.dir, 0o750); err != nil {
		return fmt.Errorf("create state directory %s: %w", l.dir, err)
	}
	path := filepath.Join(l.dir, LockFileName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("open state directory lock %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		holder := readHolder(f)
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return fmt.Errorf("%w: %s is locked by process %s (another cellium-agent on this node?): "+
				"stop that agent, or give this one its own --state-dir and --socket-path", ErrLocked, l.dir, holder)
		}
		return fmt.Errorf("lock state directory %s: %w", l.dir, err)
	}
	if err := writePID(f); err != nil {
		f.Close()
		return fmt.Errorf("write process ID to %s: %w", path, err)
	}
	l.f = f
	return nil
}

// Release unlocks the directory. The lock file stays: removing it would let
// a third agent lock a new file while a second still waits on the old one.
func (l *Lock) Release() error {
	if l.f == nil {
		return nil
	}
	err := l.f.Close() // closing the last descriptor releases the flock
	l.f = nil
	return err
}

func writePID(f *os.File) error {
	if err := f.Truncate(0); err != nil {
		return err
	}
	if _, err := f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0); err != nil {
		return err
	}
	return f.Sync()
}

// readHolder returns the process ID recorded in the lock file, or
// "unknown" when there is none.
func readHolder(f *os.File) string {
	buf := make([]byte, 32)
	n, _ := f.ReadAt(buf, 0)
	if pid := strings.TrimSpace(string(buf[:n])); pid != "" {
		if _, err := strconv.Atoi(pid); err == nil {
			return pid
		}
	}
	return "unknown"
}
