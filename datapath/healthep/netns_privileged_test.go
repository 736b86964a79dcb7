package healthep

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/cellium/cellium/datapath/link"
	"github.com/cellium/cellium/test/privileged"
)

// ensureNetns makes a namespace once and adopts it after (the same
// inode), replaces a leftover file that is no namespace, and Remove
// unpins it and is idempotent.
func TestPrivilegedHealthNetns(t *testing.T) {
	privileged.Require(t)
	path := filepath.Join("/var/run/netns", fmt.Sprintf("cellium-health-netns-test-%d", os.Getpid()))
	t.Cleanup(func() { _ = removeNetns(path) })

	created, err := ensureNetns(path)
	if err != nil || !created {
		t.Fatalf("first ensureNetns: created %v, %v", created, err)
	}
	ino, err := netnsInode(path)
	if err != nil {
		t.Fatal(err)
	}
	created, err = ensureNetns(path)
	if err != nil || created {
		t.Fatalf("second ensureNetns: created %v, %v (want the namespace adopted)", created, err)
	}
	if again, _ := netnsInode(path); again != ino {
		t.Errorf("adopted namespace has inode %d, want %d", again, ino)
	}

	// A file left at the path without a namespace behind it (an agent
	// killed between creating the file and pinning).
	if err := removeNetns(path); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	created, err = ensureNetns(path)
	if err != nil || !created || !isNetns(path) {
		t.Fatalf("ensureNetns over a leftover file: created %v, netns %v, %v", created, isNetns(path), err)
	}

	for i := 0; i < 2; i++ {
		if err := Remove(context.Background(), link.Host{}, path, "lxc_nohealth0"); err != nil {
			t.Fatalf("Remove #%d: %v", i+1, err)
		}
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("%s still exists after Remove: %v", path, err)
	}
}
