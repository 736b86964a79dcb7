package ipam

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/statedb"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/ipam/pool"
	"github.com/cellium/cellium/statedb/endpoints"
)

// fakeClock is a settable clock for the allocator.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// TestOwnership: an allocation records its pod and container; Claim and
// ReleaseOwned act only for that owner, ReleaseContainer frees exactly the
// container's addresses, and the container ID survives a restart. On the
// old main an allocation had only a name and Release freed any address.
func TestOwnership(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	a := newTestAllocator(t, dir, "boot-1")
	if err := a.setPodCIDRs(prefixes("10.0.1.0/24")); err != nil {
		t.Fatal(err)
	}
	web := Owner{Name: "ns/web", ContainerID: "c-web"}
	db := Owner{Name: "ns/db", ContainerID: "c-db"}
	w1, err := a.AllocateNext(ctx, web)
	if err != nil || w1.ContainerID != "c-web" || w1.Owner != "ns/web" {
		t.Fatalf("AllocateNext = %+v, %v", w1, err)
	}
	w2, _ := a.AllocateNext(ctx, web)
	d1, _ := a.AllocateNext(ctx, db)

	if err := a.Claim(ctx, w1.IP, web); err != nil {
		t.Errorf("Claim by the owner: %v", err)
	}
	if err := a.Claim(ctx, w1.IP, db); !errors.Is(err, ErrNotOwner) || !strings.Contains(err.Error(), "c-web") {
		t.Errorf("Claim by another pod = %v, want ErrNotOwner naming c-web", err)
	}
	if err := a.Claim(ctx, w1.IP, Owner{Name: "ns/web", ContainerID: "c-old"}); !errors.Is(err, ErrNotOwner) {
		t.Errorf("Claim by the pod's other container = %v, want ErrNotOwner", err)
	}
	if err := a.Claim(ctx, netip.MustParseAddr("10.0.1.200"), web); !errors.Is(err, ErrNotAllocated) {
		t.Errorf("Claim of a free address = %v, want ErrNotAllocated", err)
	}
	if _, err := a.AllocateIP(ctx, w1.IP, Owner{Name: "ns/web", ContainerID: "c-old"}); !errors.Is(err, pool.ErrInUse) {
		t.Errorf("AllocateIP by the pod's other container = %v, want ErrInUse", err)
	}

	if ok, err := a.ReleaseOwned(d1.IP, Owner{ContainerID: "c-web"}); ok || !errors.Is(err, ErrNotOwner) {
		t.Errorf("ReleaseOwned of db's address by c-web = %v, %v; want ErrNotOwner", ok, err)
	}
	if ok, err := a.ReleaseOwned(d1.IP, Owner{Name: "ns/web"}); ok || !errors.Is(err, ErrNotOwner) {
		t.Errorf("ReleaseOwned of db's address by name ns/web = %v, %v; want ErrNotOwner", ok, err)
	}
	if ok, err := a.ReleaseOwned(d1.IP, Owner{ContainerID: "c-db"}); !ok || err != nil {
		t.Errorf("ReleaseOwned by c-db = %v, %v", ok, err)
	}
	if ok, err := a.ReleaseOwned(d1.IP, Owner{ContainerID: "c-db"}); ok || err != nil {
		t.Errorf("second ReleaseOwned = %v, %v; want false, nil", ok, err)
	}

	// A restart keeps the container IDs.
	b := newTestAllocator(t, dir, "boot-1")
	if err := b.setPodCIDRs(prefixes("10.0.1.0/24")); err != nil {
		t.Fatal(err)
	}
	if err := b.Claim(ctx, w2.IP, Owner{Name: "ns/web", ContainerID: "c-other"}); !errors.Is(err, ErrNotOwner) {
		t.Errorf("after restart, Claim by another container = %v, want ErrNotOwner", err)
	}
	released, err := b.ReleaseContainer("c-web")
	if err != nil || len(released) != 2 || released[0].IP != w1.IP || released[1].IP != w2.IP {
		t.Errorf("ReleaseContainer = %+v, %v; want %v and %v", released, err, w1.IP, w2.IP)
	}
	if got := b.list(); len(got) != 1 || got[0].Owner != pool.RouterOwner {
		t.Errorf("left after releases: %+v, want only the router", got)
	}
}

// TestClaimAdoptsContainer: an allocation made without a container ID (an
// older plugin) is taken by the first endpoint of its pod that claims it.
func TestClaimAdoptsContainer(t *testing.T) {
	ctx := context.Background()
	a := newTestAllocator(t, "", "")
	if err := a.setPodCIDRs(prefixes("10.0.1.0/24")); err != nil {
		t.Fatal(err)
	}
	al, _ := a.AllocateNext(ctx, Owner{Name: "ns/web"})
	if err := a.Claim(ctx, al.IP, Owner{Name: "ns/web", ContainerID: "c1"}); err != nil {
		t.Fatal(err)
	}
	if err := a.Claim(ctx, al.IP, Owner{Name: "ns/web", ContainerID: "c2"}); !errors.Is(err, ErrNotOwner) {
		t.Errorf("second container's claim = %v, want ErrNotOwner", err)
	}
}

// TestHoldForRestore: no address is handed out before every restorer has
// handed over its addresses, and those are never handed out. On the old
// main the pool served as soon as it had CIDRs.
func TestHoldForRestore(t *testing.T) {
	a := newTestAllocator(t, t.TempDir(), "")
	done := a.HoldForRestore("endpoints")
	if err := a.setPodCIDRs(prefixes("10.0.1.0/29")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	if _, err := a.AllocateNext(ctx, Owner{Name: "ns/early"}); !errors.Is(err, ErrNoPodCIDR) {
		t.Errorf("AllocateNext before the hand-over = %v, want to wait", err)
	}
	cancel()
	restored := Owner{Name: "ns/live", ContainerID: "c-live"}
	done([]Claim{{IP: netip.MustParseAddr("10.0.1.2"), Owner: restored}, {IP: netip.MustParseAddr("10.0.1.4"), Owner: restored}})
	for range 3 { // 10.0.1.3, .5, .6: every other usable address
		al, err := a.AllocateNext(context.Background(), Owner{Name: "ns/new"})
		if err != nil {
			t.Fatal(err)
		}
		if al.IP == netip.MustParseAddr("10.0.1.2") || al.IP == netip.MustParseAddr("10.0.1.4") {
			t.Errorf("handed out %v, a restored endpoint's address", al.IP)
		}
	}
	if err := a.Claim(context.Background(), netip.MustParseAddr("10.0.1.4"), restored); err != nil {
		t.Errorf("restored endpoint's claim: %v", err)
	}
}

// TestGarbageCollector frees a pod address that no endpoint has used for
// the grace period, and only that: not an address an endpoint has, nor a
// young one (an ADD still running), nor the agent's own. What it freed is
// counted and listed by GET /v1/ipam/gc. On the old main an address whose
// ADD never reached its rollback stayed allocated forever.
func TestGarbageCollector(t *testing.T) {
	clock := &fakeClock{now: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)}
	a := newTestAllocator(t, t.TempDir(), "")
	a.now = clock.Now
	if err := a.setPodCIDRs(prefixes("10.0.1.0/24")); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	used, _ := a.AllocateNext(ctx, Owner{Name: "ns/used", ContainerID: "c-used"})
	leaked, _ := a.AllocateNext(ctx, Owner{Name: "ns/leaked", ContainerID: "c-dead"})
	health, _ := a.AllocateNext(ctx, Owner{Name: HealthOwner})
	clock.advance(4 * time.Minute)
	young, _ := a.AllocateNext(ctx, Owner{Name: "ns/young", ContainerID: "c-young"})
	clock.advance(2 * time.Minute)

	db := statedb.New()
	eps, err := endpoints.NewTable(db)
	if err != nil {
		t.Fatal(err)
	}
	txn := db.WriteTxn(eps)
	eps.Insert(txn, &endpoints.Endpoint{ID: 1, ContainerID: "c-used", PodNamespace: "ns", PodName: "used", IPv4: used.IP})
	txn.Commit()

	released, err := collectUnused(db, eps, a, 5*time.Minute, hivetest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(released) != 1 || released[0].IP != leaked.IP || released[0].ContainerID != "c-dead" {
		t.Fatalf("collected %+v, want only %v", released, leaked.IP)
	}
	held := map[netip.Addr]bool{}
	for _, al := range a.list() {
		held[al.IP] = true
	}
	for _, ip := range []netip.Addr{used.IP, health.IP, young.IP} {
		if !held[ip] {
			t.Errorf("%v was freed", ip)
		}
	}
	// The young one goes once its grace is over.
	clock.advance(4 * time.Minute)
	if released, _ := collectUnused(db, eps, a, 5*time.Minute, hivetest.Logger(t)); len(released) != 1 || released[0].IP != young.IP {
		t.Errorf("second pass collected %+v, want %v", released, young.IP)
	}

	reg := prometheus.NewPedanticRegistry()
	if err := registerMetrics(metricsParams{Registerer: reg, Allocator: a}); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var counted float64 = -1
	for _, mf := range mfs {
		if mf.GetName() == "cellium_ipam_gc_released_total" {
			counted = mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	if counted != 2 {
		t.Errorf("cellium_ipam_gc_released_total = %v, want 2", counted)
	}

	h := &api{a: a, grace: 5 * time.Minute}
	w := httptest.NewRecorder()
	h.gc(w, httptest.NewRequest(http.MethodGet, "/v1/ipam/gc", nil))
	var out models.IPAMGC
	if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil {
		t.Fatal(err)
	}
	if out.Grace != "5m0s" || out.ReleasedTotal != 2 || len(out.Released) != 2 ||
		out.Released[0].IP != leaked.IP.String() || out.Released[0].ContainerID != "c-dead" || out.Released[0].ReleasedAt == "" {
		t.Errorf("GET /v1/ipam/gc = %+v", out)
	}
}

// TestGarbageCollectorWaitsForRestore: before the endpoints table is
// initialized (restore still deciding), nothing is collected.
func TestGarbageCollectorWaitsForRestore(t *testing.T) {
	clock := &fakeClock{now: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)}
	a := newTestAllocator(t, "", "")
	a.now = clock.Now
	if err := a.setPodCIDRs(prefixes("10.0.1.0/24")); err != nil {
		t.Fatal(err)
	}
	if _, err := a.AllocateNext(context.Background(), Owner{Name: "ns/p", ContainerID: "c"}); err != nil {
		t.Fatal(err)
	}
	clock.advance(time.Hour)
	db := statedb.New()
	eps, _ := endpoints.NewTable(db)
	txn := db.WriteTxn(eps)
	done := eps.RegisterInitializer(txn, "restore")
	txn.Commit()
	if released, _ := collectUnused(db, eps, a, time.Minute, hivetest.Logger(t)); len(released) != 0 {
		t.Errorf("collected %+v before restore finished", released)
	}
	txn = db.WriteTxn(eps)
	done(txn)
	txn.Commit()
	if released, _ := collectUnused(db, eps, a, time.Minute, hivetest.Logger(t)); len(released) != 1 {
		t.Errorf("collected %+v after restore, want the unused address", released)
	}
}

// TestReleaseByContainerAPI: DELETE /v1/ipam/{ip}?container-id= frees
// only the container's own address (409 naming the holder otherwise, 404
// when free); without container-id the admin's release is unchanged. On
// the old main the parameter was ignored and any caller freed any address.
func TestReleaseByContainerAPI(t *testing.T) {
	a := newTestAllocator(t, "", "")
	if err := a.setPodCIDRs(prefixes("10.0.1.0/24")); err != nil {
		t.Fatal(err)
	}
	h := &api{a: a, wait: time.Second}
	do := func(method, target string, fn http.HandlerFunc, ip string) (int, string) {
		r := httptest.NewRequest(method, target, nil)
		if ip != "" {
			r.SetPathValue("ip", ip)
		}
		w := httptest.NewRecorder()
		fn(w, r)
		return w.Code, w.Body.String()
	}
	code, body := do("POST", "/v1/ipam?owner=ns/web&container-id=c-web", h.allocateNext, "")
	var resp models.IPAMResponse
	if code != http.StatusCreated || json.Unmarshal([]byte(body), &resp) != nil || resp.IPv4.ContainerID != "c-web" {
		t.Fatalf("POST = %d %s", code, body)
	}
	ip := resp.IPv4.IP
	if code, body := do("DELETE", "/v1/ipam/"+ip+"?container-id=c-other", h.release, ip); code != http.StatusConflict || !strings.Contains(body, "c-web") {
		t.Errorf("release by another container = %d %s, want 409 naming c-web", code, body)
	}
	if code, _ := do("DELETE", "/v1/ipam/"+ip+"?container-id=c-web", h.release, ip); code != http.StatusOK {
		t.Errorf("release by the owner = %d", code)
	}
	if code, _ := do("DELETE", "/v1/ipam/"+ip+"?container-id=c-web", h.release, ip); code != http.StatusNotFound {
		t.Errorf("second release = %d, want 404", code)
	}
	_, body = do("POST", "/v1/ipam?owner=ns/web&container-id=c-web", h.allocateNext, "")
	if err := json.Unmarshal([]byte(body), &resp); err != nil {
		t.Fatal(err)
	}
	ip = resp.IPv4.IP
	if code, _ := do("DELETE", "/v1/ipam/"+ip, h.release, ip); code != http.StatusOK {
		t.Errorf("admin release = %d", code)
	}
	if len(a.list()) != 1 {
		t.Errorf("admin release left %+v", a.list())
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		grace time.Duration
		ok    bool
	}{{0, true}, {5 * time.Minute, true}, {30 * time.Second, true}, {5 * time.Second, false}} {
		err := Config{IPAMGCGrace: tc.grace}.Validate()
		if (err == nil) != tc.ok || err != nil && !strings.Contains(err.Error(), "--ipam-gc-grace") {
			t.Errorf("Validate(%s) = %v", tc.grace, err)
		}
	}
}
