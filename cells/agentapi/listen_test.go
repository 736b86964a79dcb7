package agentapi_test

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/cells/agentapi"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/statedir"
)

func TestListenSocketModeWhateverTheUmask(t *testing.T) {
	// A permissive umask would leave a socket made by a plain Listen
	// world-writable until the chmod.
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	dir := filepath.Join(t.TempDir(), "run")
	if err := os.Mkdir(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "api.sock")
	// Watch the directory: the socket must arrive by rename, complete,
	// never be created there (where it would be reachable before chmod).
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_CREATE|unix.IN_MOVED_TO); err != nil {
		t.Fatal(err)
	}
	ln, err := agentapi.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	events := readInotify(t, fd)
	if events["api.sock"] != unix.IN_MOVED_TO {
		t.Errorf("socket events %#x in its directory, want only IN_MOVED_TO (%#x): it was created in place", events["api.sock"], unix.IN_MOVED_TO)
	}
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Type() != fs.ModeSocket || fi.Mode().Perm() != 0o660 {
		t.Errorf("socket mode = %v, want a socket with 0660", fi.Mode())
	}
	if ln.Addr().String() != path {
		t.Errorf("Addr = %s, want %s", ln.Addr(), path)
	}
	// No temporary directory stays behind.
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Errorf("socket directory holds %v, want only the socket", entries)
	}
}

func TestListenReplacesStaleSocketOnly(t *testing.T) {
	path := filepath.Join(t.TempDir(), "api.sock")
	// A stale socket: bound, never listened on, the process gone.
	stale, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	stale.SetUnlinkOnClose(false)
	stale.Close()
	ln, err := agentapi.Listen(path)
	if err != nil {
		t.Fatalf("Listen over a stale socket: %v", err)
	}
	// A live socket is not taken over.
	if _, err := agentapi.Listen(path); err == nil || !strings.Contains(err.Error(), "another process is serving the agent API on "+path) {
		t.Fatalf("Listen over a live socket = %v, want a refusal", err)
	}
	conn, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("the first listener's socket is gone after the refused Listen: %v", err)
	}
	conn.Close()
	ln.Close()
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("socket still there after Close: %v", err)
	}

	// A regular file is not replaced.
	if err := os.WriteFile(path, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := agentapi.Listen(path); err == nil || !strings.Contains(err.Error(), "is not a socket") {
		t.Errorf("Listen over a regular file = %v, want a refusal", err)
	}
}

// TestCloseKeepsSocketThatIsNotOurs: when someone else's socket is at the
// path by the time we stop, we leave it.
func TestCloseKeepsSocketThatIsNotOurs(t *testing.T) {
	path := filepath.Join(t.TempDir(), "api.sock")
	ln, err := agentapi.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	// Another agent replaced the socket (for example after removing ours).
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	other, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	ln.Close()
	conn, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("closing our listener removed the other socket: %v", err)
	}
	conn.Close()
}

// TestSecondAgentOnStateDirRefused runs two hives with the same state
// directory and socket: the second fails to start and names the holder's
// process ID, and stopping it leaves the first one's socket serving.
func TestSecondAgentOnStateDirRefused(t *testing.T) {
	dir := t.TempDir()
	args := []string{"--state-dir=" + filepath.Join(dir, "state"), "--socket-path=" + filepath.Join(dir, "api.sock")}
	first := startAPI2(t, args)
	second := hivetest.New(t, args, statedir.Cell, agentapi.Cell)
	err := second.Start(context.Background())
	if err == nil {
		_ = second.Stop(context.Background())
		t.Fatal("a second agent on the same state directory started")
	}
	if !errors.Is(err, statedir.ErrLocked) && !strings.Contains(err.Error(), "is locked by process") {
		t.Errorf("error %v does not say the directory is locked", err)
	}
	if want := "locked by process " + itoa(os.Getpid()); !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not name the holder (%q)", err, want)
	}
	_ = second.Stop(context.Background())
	if code, _ := first.do("GET", "/v1/healthz", ""); code != 200 {
		t.Errorf("the first agent's API answers %d after the second stopped", code)
	}
}

// TestSecondAgentOnSocketRefused: with separate state directories, the
// socket itself is protected.
func TestSecondAgentOnSocketRefused(t *testing.T) {
	dir := t.TempDir()
	sock := "--socket-path=" + filepath.Join(dir, "api.sock")
	first := startAPI2(t, []string{"--state-dir=" + filepath.Join(dir, "s1"), sock})
	second := hivetest.New(t, []string{"--state-dir=" + filepath.Join(dir, "s2"), sock}, statedir.Cell, agentapi.Cell)
	err := second.Start(context.Background())
	if err == nil {
		_ = second.Stop(context.Background())
		t.Fatal("a second agent on the same socket started")
	}
	if !strings.Contains(err.Error(), "another process is serving the agent API") {
		t.Errorf("error %v does not say the socket is in use", err)
	}
	_ = second.Stop(context.Background())
	if code, _ := first.do("GET", "/v1/healthz", ""); code != 200 {
		t.Errorf("the first agent's API answers %d after the second stopped", code)
	}
}

func startAPI2(t *testing.T, args []string) *api {
	t.Helper()
	hivetest.Start(t, args, statedir.Cell, agentapi.Cell)
	var socket string
	for _, a := range args {
		if s, ok := strings.CutPrefix(a, "--socket-path="); ok {
			socket = s
		}
	}
	return &api{t: t, socket: socket, c: client(socket)}
}

func itoa(n int) string { return strconv.Itoa(n) }

// readInotify returns the event masks seen so far, by file name.
func readInotify(t *testing.T, fd int) map[string]uint32 {
	t.Helper()
	out := map[string]uint32{}
	buf := make([]byte, 64<<10)
	n, err := unix.Read(fd, buf)
	if err != nil {
		t.Fatalf("read inotify events: %v", err)
	}
	for off := 0; off+unix.SizeofInotifyEvent <= n; {
		ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
		name := string(bytes.TrimRight(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+int(ev.Len)], "\x00"))
		out[name] |= ev.Mask
		off += unix.SizeofInotifyEvent + int(ev.Len)
	}
	return out
}

func TestListenPathTooLong(t *testing.T) {
	dir := filepath.Join(t.TempDir(), strings.Repeat("d", 100-len(t.TempDir())))
	_, err := agentapi.Listen(filepath.Join(dir, "api.sock"))
	if err == nil || !strings.Contains(err.Error(), "choose a shorter --socket-path") {
		t.Fatalf("Listen with a too long path = %v", err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 0 {
		t.Errorf("left %v behind", entries)
	}
}
