package main

import (
	"os"
	"path/filepath"
	"testing"
)

// up saves the sysctls the agent changes, down writes them back; a second
// save (up into a directory that has a record) keeps the first record.
func TestSaveRestoreHostSysctls(t *testing.T) {
	proc, dir := t.TempDir(), t.TempDir()
	set := func(p, v string) {
		t.Helper()
		f := filepath.Join(proc, p)
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	get := func(p string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(proc, p))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if restored, err := restoreHostSysctls(dir, proc); restored || err != nil {
		t.Fatalf("restore without a record: %v, %v", restored, err)
	}
	set("net/ipv4/ip_forward", "0")
	set("net/ipv4/conf/all/rp_filter", "2")
	if err := saveHostSysctls(dir, proc); err != nil {
		t.Fatal(err)
	}
	// The agent changes them.
	set("net/ipv4/ip_forward", "1")
	set("net/ipv4/conf/all/rp_filter", "0")
	if err := saveHostSysctls(dir, proc); err != nil {
		t.Fatal(err)
	}
	if restored, err := restoreHostSysctls(dir, proc); !restored || err != nil {
		t.Fatalf("restore: %v, %v", restored, err)
	}
	if got := get("net/ipv4/ip_forward"); got != "0\n" {
		t.Errorf("ip_forward = %q, want 0", got)
	}
	if got := get("net/ipv4/conf/all/rp_filter"); got != "2\n" {
		t.Errorf("rp_filter = %q, want 2", got)
	}
}
