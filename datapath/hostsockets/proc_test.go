package hostsockets_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/cellium/cellium/datapath/hostsockets"
)

// fakeProc makes a /proc with the processes pid → (comm, fd targets).
func fakeProc(t *testing.T, procs map[string][2][]string) string {
	t.Helper()
	dir := t.TempDir()
	for pid, p := range procs {
		fd := filepath.Join(dir, pid, "fd")
		if err := os.MkdirAll(fd, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, pid, "comm"), []byte(p[0][0]+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		for i, target := range p[1] {
			if err := os.Symlink(target, filepath.Join(fd, string(rune('3'+i)))); err != nil {
				t.Fatal(err)
			}
		}
	}
	return dir
}

func TestProcesses(t *testing.T) {
	dir := fakeProc(t, map[string][2][]string{
		"100": {{"nginx"}, {"/dev/null", "socket:[42]", "pipe:[43]"}},
		"200": {{"dnsmasq"}, {"socket:[44]", "socket:[x]", "socket:[45"}},
		"300": {{"other"}, {"socket:[99]"}},
	})
	if err := os.MkdirAll(filepath.Join(dir, "self", "fd"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("socket:[7]", filepath.Join(dir, "self", "fd", "3")); err != nil {
		t.Fatal(err)
	}
	got := hostsockets.Processes(dir, []uint32{42, 44, 43, 1000})
	want := map[uint32]string{42: "nginx (pid 100)", 44: "dnsmasq (pid 200)"}
	if len(got) != len(want) {
		t.Fatalf("Processes = %v, want %v", got, want)
	}
	for ino, w := range want {
		if got[ino].String() != w {
			t.Errorf("inode %d: got %v, want %s", ino, got[ino], w)
		}
	}
	if got := hostsockets.Processes(dir, nil); len(got) != 0 {
		t.Errorf("Processes of no inode = %v", got)
	}
	own, err := hostsockets.OwnInodes(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(own) != 1 || !own[7] {
		t.Errorf("OwnInodes = %v, want inode 7", own)
	}
	if _, err := hostsockets.OwnInodes(t.TempDir()); err == nil {
		t.Error("OwnInodes of a /proc without self: no error")
	}
}
