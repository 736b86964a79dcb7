package ipam

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	k8stables "github.com/cellium/cellium/statedb/k8s"
)

// nopHealth is a hive.Health that records the last degraded error.
type nopHealth struct{ lastErr error }

func (h *nopHealth) OK(string)                  {}
func (h *nopHealth) Degraded(_ string, e error) { h.lastErr = e }
func (h *nopHealth) Stopped(string)             {}
func (h *nopHealth) Scope(string) hive.Health   { return h }

func TestRestoreGC(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	a := newTestAllocator(t, dir, "")
	if err := a.setPodCIDRs(prefixes("10.0.1.0/24")); err != nil {
		t.Fatal(err)
	}
	alive, _ := a.AllocateNext(ctx, Owner{Name: "ns/alive"})
	gone, _ := a.AllocateNext(ctx, Owner{Name: "ns/gone"})
	claimed, _ := a.AllocateNext(ctx, Owner{Name: "ns/claimed"})
	health, _ := a.AllocateNext(ctx, Owner{Name: HealthOwner})

	// Restart: ns/claimed's endpoint is restored and claims its address;
	// ns/gone was deleted while the agent was down.
	b := newTestAllocator(t, dir, "")
	if err := b.setPodCIDRs(prefixes("10.0.1.0/24")); err != nil {
		t.Fatal(err)
	}
	if _, err := b.AllocateIP(ctx, claimed.IP, Owner{Name: "ns/claimed"}); err != nil {
		t.Fatal(err)
	}

	db := statedb.New()
	pods, err := k8stables.NewPodsTable(db)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Start(); err != nil {
		t.Fatal(err)
	}
	defer db.Stop()
	txn := db.WriteTxn(pods)
	initDone := pods.RegisterInitializer(txn, "test")
	pods.Insert(txn, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "alive"}})
	txn.Commit()

	done := make(chan error, 1)
	go func() {
		done <- restoreGC(ctx, &nopHealth{}, db, pods, b, 20*time.Millisecond, 10*time.Millisecond, hivetest.Logger(t))
	}()
	time.Sleep(50 * time.Millisecond)
	if _, err := b.AllocateIP(ctx, gone.IP, Owner{Name: "ns/other"}); err == nil {
		t.Fatal("released before the pods table was initialized")
	}
	txn = db.WriteTxn(pods)
	initDone(txn)
	txn.Commit()

	deadline := time.Now().Add(5 * time.Second)
	for {
		owners := b.unclaimedOwners()
		if _, held := owners[gone.IP]; !held {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("address of the deleted pod still held: %v", owners)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for ip, owner := range map[netip.Addr]string{alive.IP: "ns/alive", claimed.IP: "ns/claimed", health.IP: HealthOwner} {
		if got, err := b.ownedBy(ctx, owner); err != nil || len(got) != 1 || got[0] != ip {
			t.Errorf("%s holds %v, want %v", owner, got, ip)
		}
	}
	for st := readState(t, dir); len(st.Allocations) != 3; st = readState(t, dir) {
		if time.Now().After(deadline) {
			t.Fatalf("state file = %v, want 3 allocations", st.Allocations)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Once ns/alive goes too, the job releases it and ends.
	txn = db.WriteTxn(pods)
	pods.DeleteAll(txn)
	txn.Commit()
	select {
	case err := <-done:
		if err != nil {
			t.Error(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("restoreGC did not end once no restored pod address was left")
	}
	if got, _ := b.ownedBy(ctx, "ns/alive"); len(got) != 0 {
		t.Errorf("ns/alive still holds %v", got)
	}
}

func TestAPIErrors(t *testing.T) {
	a := newTestAllocator(t, "", "")
	h := &api{a: a, wait: 20 * time.Millisecond}
	type result struct {
		Code int
		Body string // the error message, or the body
	}
	do := func(method, target string, fn http.HandlerFunc, pathIP string) result {
		r := httptest.NewRequest(method, target, nil)
		if pathIP != "" {
			r.SetPathValue("ip", pathIP)
		}
		w := httptest.NewRecorder()
		fn(w, r)
		var e models.Error
		if w.Code >= 400 && json.Unmarshal(w.Body.Bytes(), &e) == nil {
			return result{w.Code, e.Message}
		}
		return result{w.Code, w.Body.String()}
	}
	for _, tc := range []struct {
		name     string
		method   string
		target   string
		fn       http.HandlerFunc
		ip       string
		wantCode int
		wantMsg  string
	}{
		{"no CIDR yet", "POST", "/v1/ipam?owner=ns/p", h.allocateNext, "", 503, "is cellium-operator running with --cluster-pool-ipv4-cidr?"},
		{"no owner", "POST", "/v1/ipam", h.allocateNext, "", 400, "owner=<namespace>/<pod>"},
		{"ipv6", "POST", "/v1/ipam?owner=ns/p&family=ipv6", h.allocateNext, "", 400, "IPv4 addresses only"},
		{"bad IP", "DELETE", "/v1/ipam/x", h.release, "x", 400, "invalid IP address"},
		{"release before CIDRs", "DELETE", "/v1/ipam/10.0.1.9", h.release, "10.0.1.9", 200, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := do(tc.method, tc.target, tc.fn, tc.ip)
			if w.Code != tc.wantCode || !strings.Contains(w.Body, tc.wantMsg) {
				t.Errorf("%s %s = %d %s, want %d with %q", tc.method, tc.target, w.Code, w.Body, tc.wantCode, tc.wantMsg)
			}
		})
	}

	if err := a.setPodCIDRs(prefixes("10.0.1.0/30")); err != nil {
		t.Fatal(err)
	}
	if w := do("POST", "/v1/ipam?owner=ns/p", h.allocateNext, ""); w.Code != http.StatusCreated || !strings.Contains(w.Body, `"gateway": "10.0.1.1"`) {
		t.Fatalf("allocate: %d %s", w.Code, w.Body)
	}
	for _, tc := range []struct {
		name, method, target, ip string
		fn                       http.HandlerFunc
		wantCode                 int
		wantMsg                  string
	}{
		{"exhausted", "POST", "/v1/ipam?owner=ns/q", "", h.allocateNext, 503, "10.0.1.0/30"},
		{"held by another", "POST", "/v1/ipam/10.0.1.2?owner=ns/q", "10.0.1.2", h.allocateIP, 409, `held by "ns/p"`},
		{"router", "DELETE", "/v1/ipam/10.0.1.1", "10.0.1.1", h.release, 403, "reserved"},
		{"outside", "DELETE", "/v1/ipam/10.9.0.1", "10.9.0.1", h.release, 400, "not in pool"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := do(tc.method, tc.target, tc.fn, tc.ip)
			if w.Code != tc.wantCode || !strings.Contains(w.Body, tc.wantMsg) {
				t.Errorf("%s %s = %d %s, want %d with %q", tc.method, tc.target, w.Code, w.Body, tc.wantCode, tc.wantMsg)
			}
		})
	}
}
