package ipam

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/ipam/pool"
)

const testNode = "node1"

func prefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

// newTestAllocator returns an allocator persisting into dir (none if dir
// is empty) with the given boot ID, restored from its state file.
func newTestAllocator(t *testing.T, dir, bootID string) *allocator {
	t.Helper()
	var store *stateStore
	if dir != "" {
		store = newStateStore(filepath.Join(dir, StateFileName), bootID)
	}
	a := newAllocatorCore(testNode, store, hivetest.Logger(t))
	if err := a.restore(); err != nil {
		t.Fatalf("restore: %v", err)
	}
	return a
}

func readState(t *testing.T, dir string) stateFile {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, StateFileName))
	if err != nil {
		t.Fatal(err)
	}
	var st stateFile
	if err := json.Unmarshal(data, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

func TestAllocateNextWaitsForPodCIDRs(t *testing.T) {
	a := newTestAllocator(t, "", "")
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := a.AllocateNext(ctx, Owner{Name: "ns/p"})
	if err == nil {
		t.Fatal("AllocateNext succeeded without pod CIDRs")
	}
	want := "no pod CIDR for node node1 yet: is cellium-operator running with --cluster-pool-ipv4-cidr?"
	if !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not say %q", err, want)
	}
	if !errors.Is(err, ErrNoPodCIDR) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("error %v: want ErrNoPodCIDR and DeadlineExceeded", err)
	}
	if _, ok := a.RouterIP(); ok {
		t.Error("RouterIP known without pod CIDRs")
	}

	// A waiting call completes when the CIDRs arrive.
	done := make(chan Allocation, 1)
	go func() {
		al, err := a.AllocateNext(context.Background(), Owner{Name: "ns/waiting"})
		if err != nil {
			t.Errorf("waiting AllocateNext: %v", err)
		}
		done <- al
	}()
	time.Sleep(10 * time.Millisecond)
	if err := a.setPodCIDRs(prefixes("10.0.1.0/24")); err != nil {
		t.Fatal(err)
	}
	select {
	case al := <-done:
		if al.IP != netip.MustParseAddr("10.0.1.2") {
			t.Errorf("got %v, want 10.0.1.2", al.IP)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("AllocateNext still waiting after the CIDRs arrived")
	}
}

func TestAllocate(t *testing.T) {
	dir := t.TempDir()
	a := newTestAllocator(t, dir, "boot-1")
	if err := a.setPodCIDRs(prefixes("10.0.1.0/24", "10.0.9.0/28")); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	al, err := a.AllocateNext(ctx, Owner{Name: "ns/p1"})
	if err != nil {
		t.Fatal(err)
	}
	want := Allocation{IP: netip.MustParseAddr("10.0.1.2"), Gateway: netip.MustParseAddr("10.0.1.1"),
		CIDRs: prefixes("10.0.1.0/24", "10.0.9.0/28"), Owner: "ns/p1", Since: al.Since}
	if fmt.Sprint(al) != fmt.Sprint(want) || al.Since.IsZero() {
		t.Errorf("got %+v, want %+v", al, want)
	}
	if r, ok := a.RouterIP(); !ok || r != want.Gateway {
		t.Errorf("RouterIP = %v, %v", r, ok)
	}
	// A given address: again by the same owner is fine, by another not.
	ip := netip.MustParseAddr("10.0.9.5")
	if _, err := a.AllocateIP(ctx, ip, Owner{Name: "ns/p2"}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.AllocateIP(ctx, ip, Owner{Name: "ns/p2"}); err != nil {
		t.Errorf("same owner again: %v", err)
	}
	if _, err := a.AllocateIP(ctx, ip, Owner{Name: "ns/other"}); !errors.Is(err, pool.ErrInUse) {
		t.Errorf("other owner: %v, want ErrInUse", err)
	}
	if _, err := a.AllocateIP(ctx, netip.MustParseAddr("192.168.0.1"), Owner{Name: "ns/p3"}); !errors.Is(err, pool.ErrNotInPool) {
		t.Errorf("outside the CIDRs: %v, want ErrNotInPool", err)
	}
	if _, err := a.AllocateNext(ctx, Owner{Name: ""}); !errors.Is(err, pool.ErrEmptyOwner) {
		t.Errorf("empty owner: %v", err)
	}
	if got, err := a.ownedBy(ctx, "ns/p2"); err != nil || len(got) != 1 || got[0] != ip {
		t.Errorf("OwnedBy = %v, %v", got, err)
	}

	st := readState(t, dir)
	if st.Node != testNode || st.BootID != "boot-1" || len(st.Allocations) != 2 ||
		st.Allocations[0] != (stateEntry{IP: want.IP, Owner: "ns/p1"}) || st.Allocations[1] != (stateEntry{IP: ip, Owner: "ns/p2"}) {
		t.Errorf("state file = %+v", st)
	}
}

func TestExhaustion(t *testing.T) {
	a := newTestAllocator(t, t.TempDir(), "")
	if err := a.setPodCIDRs(prefixes("10.0.1.0/30")); err != nil {
		t.Fatal(err)
	}
	if _, err := a.AllocateNext(context.Background(), Owner{Name: "ns/p1"}); err != nil {
		t.Fatal(err)
	}
	_, err := a.AllocateNext(context.Background(), Owner{Name: "ns/p2"})
	if !errors.Is(err, pool.ErrPoolExhausted) {
		t.Fatalf("got %v, want ErrPoolExhausted", err)
	}
	for _, want := range []string{"ns/p2", "10.0.1.0/30", "IP pool exhausted"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
}

func TestRelease(t *testing.T) {
	dir := t.TempDir()
	a := newTestAllocator(t, dir, "")
	// Before the pool exists, releasing is fine (nothing to do).
	if err := a.Release(netip.MustParseAddr("10.0.1.7")); err != nil {
		t.Errorf("release before pod CIDRs: %v", err)
	}
	if err := a.setPodCIDRs(prefixes("10.0.1.0/24")); err != nil {
		t.Fatal(err)
	}
	al, err := a.AllocateNext(context.Background(), Owner{Name: "ns/p"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := a.Release(al.IP); err != nil {
			t.Errorf("release #%d: %v", i+1, err)
		}
	}
	if st := readState(t, dir); len(st.Allocations) != 0 {
		t.Errorf("state still lists %v", st.Allocations)
	}
	if err := a.Release(al.Gateway); !errors.Is(err, pool.ErrReserved) {
		t.Errorf("release router: %v, want ErrReserved", err)
	}
	if err := a.Release(netip.MustParseAddr("10.9.9.9")); !errors.Is(err, pool.ErrNotInPool) {
		t.Errorf("release outside: %v, want ErrNotInPool", err)
	}
}

func TestConcurrentAllocationsAreDistinct(t *testing.T) {
	dir := t.TempDir()
	a := newTestAllocator(t, dir, "")
	const n = 50
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex
		ips = map[netip.Addr]string{}
	)
	for i := range n {
		wg.Go(func() {
			owner := fmt.Sprintf("ns/p%d", i)
			al, err := a.AllocateNext(context.Background(), Owner{Name: owner})
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if prev, dup := ips[al.IP]; dup {
				t.Errorf("%v given to %s and %s", al.IP, prev, owner)
			}
			ips[al.IP] = owner
		})
	}
	time.Sleep(5 * time.Millisecond) // let some wait for the CIDRs
	if err := a.setPodCIDRs(prefixes("10.0.1.0/24")); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if len(ips) != n {
		t.Fatalf("%d distinct addresses, want %d", len(ips), n)
	}
	st := readState(t, dir)
	if len(st.Allocations) != n {
		t.Errorf("state file has %d allocations, want %d", len(st.Allocations), n)
	}
	for _, e := range st.Allocations {
		if ips[e.IP] != e.Owner {
			t.Errorf("state file: %v owned by %q, allocated to %q", e.IP, e.Owner, ips[e.IP])
		}
	}
}

func TestRestore(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	a := newTestAllocator(t, dir, "boot-1")
	if err := a.setPodCIDRs(prefixes("10.0.1.0/24")); err != nil {
		t.Fatal(err)
	}
	p1, _ := a.AllocateNext(ctx, Owner{Name: "ns/p1"})
	p2, _ := a.AllocateNext(ctx, Owner{Name: "ns/p2"})
	health, _ := a.AllocateNext(ctx, Owner{Name: HealthOwner})

	// A restarted agent: restored allocations are held before anyone claims them.
	b := newTestAllocator(t, dir, "boot-1")
	if err := b.Release(p2.IP); err != nil { // a DEL before the CIDRs are known
		t.Fatal(err)
	}
	if err := b.setPodCIDRs(prefixes("10.0.1.0/24")); err != nil {
		t.Fatal(err)
	}
	if _, err := b.AllocateIP(ctx, p1.IP, Owner{Name: "ns/p1"}); err != nil {
		t.Errorf("re-claim by the same owner: %v", err)
	}
	if _, err := b.AllocateIP(ctx, health.IP, Owner{Name: "ns/intruder"}); !errors.Is(err, pool.ErrInUse) {
		t.Errorf("claim of a restored address by another owner: %v, want ErrInUse", err)
	}
	if got := b.unclaimedOwners(); len(got) != 1 || got[health.IP] != HealthOwner {
		t.Errorf("unclaimed = %v, want only the health IP", got)
	}
	next, err := b.AllocateNext(ctx, Owner{Name: "ns/p3"})
	if err != nil {
		t.Fatal(err)
	}
	if next.IP == p1.IP || next.IP == health.IP {
		t.Errorf("restored address %v handed out again", next.IP)
	}
	if got, _ := b.ownedBy(ctx, "ns/p2"); len(got) != 0 {
		t.Errorf("address released before the restore was restored: %v", got)
	}

	// After a reboot, pod addresses are dropped, others kept.
	c := newTestAllocator(t, dir, "boot-2")
	if err := c.setPodCIDRs(prefixes("10.0.1.0/24")); err != nil {
		t.Fatal(err)
	}
	if got, _ := c.ownedBy(ctx, HealthOwner); len(got) != 1 || got[0] != health.IP {
		t.Errorf("health IP after reboot = %v, want %v", got, health.IP)
	}
	if _, err := c.AllocateIP(ctx, p1.IP, Owner{Name: "ns/new"}); err != nil {
		t.Errorf("pod address from before the reboot still held: %v", err)
	}

	// New CIDRs: restored addresses outside them are dropped.
	d := newTestAllocator(t, dir, "boot-2")
	if err := d.setPodCIDRs(prefixes("10.0.7.0/24")); err != nil {
		t.Fatal(err)
	}
	if got := d.list(); len(got) != 1 || got[0].Owner != pool.RouterOwner {
		t.Errorf("allocations after a CIDR change = %v, want only the router", got)
	}
}

func TestRestoreRejects(t *testing.T) {
	write := func(t *testing.T, content string) string {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, StateFileName), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	for _, tc := range []struct {
		name, content, wantErr string
		wantRestored           int
	}{
		{"corrupt", "{not json", "corrupt", 0},
		{"other version", `{"version": 99, "node": "node1", "allocations": []}`, "version 99", 0},
		{"other node", `{"version": 1, "node": "node2", "allocations": [{"ip": "10.0.1.5", "owner": "ns/p"}]}`, "", 0},
		{"invalid entries", `{"version": 1, "node": "node1", "allocations": [{"ip": "10.0.1.5", "owner": ""}, {"ip": "10.0.1.6", "owner": "a/b"}, {"ip": "10.0.1.6", "owner": "c/d"}]}`, "", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newAllocatorCore(testNode, newStateStore(filepath.Join(write(t, tc.content), StateFileName), ""), hivetest.Logger(t))
			err := a.restore()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "move it away") {
					t.Errorf("restore error %v, want one containing %q and advice", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(a.restored) != tc.wantRestored {
				t.Errorf("restored %v, want %d entries", a.restored, tc.wantRestored)
			}
		})
	}
}

func TestPodCIDRChanges(t *testing.T) {
	ctx := context.Background()
	a := newTestAllocator(t, t.TempDir(), "")
	if err := a.setPodCIDRs(prefixes("10.0.1.0/30")); err != nil {
		t.Fatal(err)
	}
	al, err := a.AllocateNext(ctx, Owner{Name: "ns/p1"})
	if err != nil {
		t.Fatal(err)
	}
	// A CIDR added: allocations kept, more room.
	if err := a.setPodCIDRs(prefixes("10.0.1.0/30", "10.0.2.0/30")); err != nil {
		t.Fatal(err)
	}
	if _, err := a.AllocateIP(ctx, al.IP, Owner{Name: "ns/other"}); !errors.Is(err, pool.ErrInUse) {
		t.Errorf("allocation lost when a CIDR was added: %v", err)
	}
	if _, err := a.AllocateNext(ctx, Owner{Name: "ns/p2"}); err != nil {
		t.Errorf("no room after a CIDR was added: %v", err)
	}
	// The first CIDR replaced: refused, the old ones stay.
	if err := a.setPodCIDRs(prefixes("10.0.3.0/24")); !errors.Is(err, ErrCIDRsChanged) {
		t.Errorf("first CIDR replaced: %v, want ErrCIDRsChanged", err)
	}
	// A CIDR with an allocation removed: refused.
	if err := a.setPodCIDRs(prefixes("10.0.1.0/30")); !errors.Is(err, ErrCIDRsChanged) {
		t.Errorf("used CIDR removed: %v, want ErrCIDRsChanged", err)
	}
	if r, _ := a.RouterIP(); r != netip.MustParseAddr("10.0.1.1") {
		t.Errorf("router moved to %v", r)
	}
	// Unusable CIDRs from the operator.
	b := newTestAllocator(t, "", "")
	if err := b.setPodCIDRs(prefixes("10.0.1.0/31")); err == nil {
		t.Error("a /31 pool was accepted")
	}
}

func TestNoWriteBeforeRestore(t *testing.T) {
	dir := t.TempDir()
	a := newTestAllocator(t, dir, "")
	if err := a.setPodCIDRs(prefixes("10.0.1.0/24")); err != nil {
		t.Fatal(err)
	}
	if _, err := a.AllocateNext(context.Background(), Owner{Name: "ns/p"}); err != nil {
		t.Fatal(err)
	}
	b := newAllocatorCore(testNode, newStateStore(filepath.Join(dir, StateFileName), ""), hivetest.Logger(t))
	if err := b.Release(netip.MustParseAddr("10.0.1.2")); !errors.Is(err, errNotStarted) {
		t.Errorf("Release before restore = %v, want errNotStarted", err)
	}
	if err := b.setPodCIDRs(prefixes("10.0.1.0/24")); !errors.Is(err, errNotStarted) {
		t.Errorf("setPodCIDRs before restore = %v, want errNotStarted", err)
	}
	if st := readState(t, dir); len(st.Allocations) != 1 {
		t.Errorf("state file overwritten before restore: %v", st.Allocations)
	}
}

func TestPersistFailureUndoesAllocation(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "missing")
	a := newAllocatorCore(testNode, newStateStore(filepath.Join(dir, StateFileName), ""), hivetest.Logger(t))
	if err := a.restore(); err != nil {
		t.Fatal(err)
	}
	if err := a.setPodCIDRs(prefixes("10.0.1.0/30")); err == nil {
		t.Error("setPodCIDRs succeeded although the state cannot be written")
	}
	_, err := a.AllocateNext(context.Background(), Owner{Name: "ns/p"})
	if err == nil || !strings.Contains(err.Error(), "--state-dir") {
		t.Fatalf("AllocateNext = %v, want an error naming --state-dir", err)
	}
	if used, _ := a.stats(); used != 1 {
		t.Errorf("%d addresses in use, want only the router's", used)
	}
}
