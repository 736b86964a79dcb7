package nodeinit

import (
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/datapath/socklb"
	"github.com/cellium/cellium/test/privileged"
)

// TestPrivilegedMountCgroup2 mounts the cgroup v2 hierarchy from the host's
// cgroup namespace (the init container's path, with this machine's /proc
// as the host's), finds it mounted the second time, and the mount's root
// is the hierarchy's root (it holds cgroup.procs and no cgroup.type: the
// root cgroup has none).
func TestPrivilegedMountCgroup2(t *testing.T) {
	privileged.Require(t)
	dir := filepath.Join(t.TempDir(), "cgroupv2")
	mounted, err := MountCgroup2(dir, "/proc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	if !mounted {
		t.Fatal("MountCgroup2 did not mount on an empty directory")
	}
	if ok, err := socklb.IsCgroup2(dir); err != nil || !ok {
		t.Fatalf("%s is not a cgroup2 mount (%v)", dir, err)
	}
	if err := unix.Access(filepath.Join(dir, "cgroup.procs"), unix.F_OK); err != nil {
		t.Fatalf("no cgroup.procs in the mount: %v", err)
	}
	if err := unix.Access(filepath.Join(dir, "cgroup.type"), unix.F_OK); err == nil {
		t.Error("the mount shows a cgroup.type file: it is a child cgroup, not the hierarchy's root")
	}
	again, err := MountCgroup2(dir, "/proc")
	if err != nil || again {
		t.Fatalf("second call: mounted %v, err %v; want already mounted", again, err)
	}
	if _, err := MountCgroup2(filepath.Join(t.TempDir(), "x"), "/nonexistent"); err == nil {
		t.Error("no error without the host's /proc")
	}
}
