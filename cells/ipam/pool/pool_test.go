package pool

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
)

func mustNew(t testing.TB, cidrs ...string) *Pool {
	t.Helper()
	var ps []netip.Prefix
	for _, c := range cidrs {
		ps = append(ps, netip.MustParsePrefix(c))
	}
	p, err := New(ps...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func ip(s string) netip.Addr { return netip.MustParseAddr(s) }

func TestNewErrors(t *testing.T) {
	tests := []struct {
		cidrs []string
		want  string
	}{
		{nil, "no pod CIDR"},
		{[]string{"fd00::/120"}, "not an IPv4 CIDR"},
		{[]string{"::ffff:10.0.0.0/120"}, "not an IPv4 CIDR"},
		{[]string{"10.0.1.5/24"}, "host bits set, the CIDR is 10.0.1.0/24"},
		{[]string{"10.0.0.0/31"}, "between /8 and /30"},
		{[]string{"10.0.0.0/32"}, "between /8 and /30"},
		{[]string{"10.0.0.0/7"}, "between /8 and /30"},
		{[]string{"10.0.0.0/16", "10.0.1.0/24"}, "10.0.1.0/24 overlaps 10.0.0.0/16"},
		{[]string{"10.0.1.0/24", "10.0.1.0/24"}, "overlaps"},
	}
	for _, tt := range tests {
		var ps []netip.Prefix
		for _, c := range tt.cidrs {
			ps = append(ps, netip.MustParsePrefix(c))
		}
		_, err := New(ps...)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("New(%v) error = %v, want one containing %q", tt.cidrs, err, tt.want)
		}
	}
	if _, err := New(netip.Prefix{}); err == nil {
		t.Error("New(invalid prefix) succeeded")
	}
}

func TestRouterReservation(t *testing.T) {
	p := mustNew(t, "10.0.1.0/24", "10.0.2.0/24")
	if got := p.RouterIP(); got != ip("10.0.1.1") {
		t.Fatalf("RouterIP() = %v, want 10.0.1.1", got)
	}
	if owner, ok := p.Owner(ip("10.0.1.1")); !ok || owner != RouterOwner {
		t.Errorf("Owner(router) = %q, %v", owner, ok)
	}
	if p.Used() != 1 || p.Capacity() != 508 {
		t.Errorf("Used/Capacity = %d/%d, want 1/508", p.Used(), p.Capacity())
	}
	if err := p.Release(ip("10.0.1.1")); !errors.Is(err, ErrReserved) {
		t.Errorf("Release(router) = %v, want ErrReserved", err)
	}
	if err := p.AllocateIP(ip("10.0.1.1"), "default/pod"); !errors.Is(err, ErrInUse) {
		t.Errorf("AllocateIP(router) = %v, want ErrInUse", err)
	}
	if err := p.AllocateIP(ip("10.0.1.1"), RouterOwner); err != nil {
		t.Errorf("restoring the router IP for the router = %v", err)
	}
}

func TestAllocateOrder(t *testing.T) {
	p := mustNew(t, "10.0.1.0/30", "10.0.2.0/29")
	var got []string
	for i := range 7 {
		a, err := p.Allocate(fmt.Sprintf("ns/p%d", i))
		if err != nil {
			t.Fatalf("Allocate #%d: %v", i, err)
		}
		got = append(got, a.String())
	}
	// .0 network, .1 router, .3 broadcast of the /30; .0 and .7 of the /29.
	want := "10.0.1.2 10.0.2.1 10.0.2.2 10.0.2.3 10.0.2.4 10.0.2.5 10.0.2.6"
	if strings.Join(got, " ") != want {
		t.Errorf("allocation order = %s, want %s", strings.Join(got, " "), want)
	}
	_, err := p.Allocate("ns/extra")
	if !errors.Is(err, ErrPoolExhausted) {
		t.Fatalf("Allocate on a full pool = %v, want ErrPoolExhausted", err)
	}
	for _, s := range []string{"10.0.1.0/30", "10.0.2.0/29", "all 8 usable addresses", "10.0.1.1"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("exhaustion error %q does not mention %q", err, s)
		}
	}
}

func TestAllocateDoesNotReuseAtOnce(t *testing.T) {
	p := mustNew(t, "10.0.1.0/29") // usable .2-.6 for pods
	a, _ := p.Allocate("ns/a")
	if err := p.Release(a); err != nil {
		t.Fatal(err)
	}
	b, _ := p.Allocate("ns/b")
	if b == a {
		t.Errorf("released %v was handed out again at once", a)
	}
	// After wrapping around, released addresses are used again.
	for range 3 {
		if _, err := p.Allocate("ns/x"); err != nil {
			t.Fatal(err)
		}
	}
	c, err := p.Allocate("ns/c")
	if err != nil || c != a {
		t.Errorf("after wrap-around Allocate = %v, %v; want %v", c, err, a)
	}
	if _, err := p.Allocate("ns/d"); !errors.Is(err, ErrPoolExhausted) {
		t.Errorf("Allocate = %v, want ErrPoolExhausted", err)
	}
}

func TestAllocateIP(t *testing.T) {
	p := mustNew(t, "10.0.1.0/24")
	tests := []struct {
		ip, owner string
		wantErr   error
	}{
		{"10.0.1.10", "ns/a", nil},
		{"10.0.1.10", "ns/a", nil}, // same owner: idempotent
		{"10.0.1.10", "ns/b", ErrInUse},
		{"::ffff:10.0.1.11", "ns/b", nil}, // IPv4-mapped form is the same address
		{"10.0.1.0", "ns/c", ErrNotInPool},
		{"10.0.1.255", "ns/c", ErrNotInPool},
		{"10.0.2.1", "ns/c", ErrNotInPool},
		{"fd00::1", "ns/c", ErrNotInPool},
		{"10.0.1.12", "", ErrEmptyOwner},
	}
	for _, tt := range tests {
		err := p.AllocateIP(ip(tt.ip), tt.owner)
		if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil) != (err == nil) {
			t.Errorf("AllocateIP(%s, %q) = %v, want %v", tt.ip, tt.owner, err, tt.wantErr)
		}
	}
	if err := p.AllocateIP(ip("10.0.1.10"), "ns/b"); err == nil || !strings.Contains(err.Error(), `held by "ns/a"`) {
		t.Errorf("conflict error %v does not name the holder", err)
	}
	want := map[netip.Addr]string{ip("10.0.1.1"): RouterOwner, ip("10.0.1.10"): "ns/a", ip("10.0.1.11"): "ns/b"}
	if got := p.Dump(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Dump() = %v, want %v", got, want)
	}
	if p.Used() != 3 {
		t.Errorf("Used() = %d, want 3", p.Used())
	}
	// Allocate skips restored addresses.
	for range 10 {
		a, err := p.Allocate("ns/new")
		if err != nil {
			t.Fatal(err)
		}
		if a == ip("10.0.1.10") || a == ip("10.0.1.11") {
			t.Fatalf("Allocate handed out restored %v", a)
		}
	}
}

func TestRelease(t *testing.T) {
	p := mustNew(t, "10.0.1.0/24")
	a, _ := p.Allocate("ns/a")
	if err := p.Release(a); err != nil {
		t.Fatalf("Release = %v", err)
	}
	if err := p.Release(a); err != nil {
		t.Errorf("second Release = %v, want nil", err)
	}
	if err := p.Release(ip("10.0.1.77")); err != nil {
		t.Errorf("Release of a never allocated IP = %v, want nil", err)
	}
	if _, ok := p.Owner(a); ok {
		t.Error("released IP still has an owner")
	}
	if p.Used() != 1 {
		t.Errorf("Used() = %d, want 1", p.Used())
	}
	for _, s := range []string{"10.0.2.1", "10.0.1.0", "10.0.1.255", "fd00::1"} {
		if err := p.Release(ip(s)); !errors.Is(err, ErrNotInPool) {
			t.Errorf("Release(%s) = %v, want ErrNotInPool", s, err)
		}
	}
	if _, err := p.Allocate(""); !errors.Is(err, ErrEmptyOwner) {
		t.Errorf("Allocate(\"\") = %v, want ErrEmptyOwner", err)
	}
}

func TestCIDRs(t *testing.T) {
	p := mustNew(t, "10.0.2.0/24", "10.0.1.0/24")
	if got := fmt.Sprint(p.CIDRs()); got != "[10.0.2.0/24 10.0.1.0/24]" {
		t.Errorf("CIDRs() = %s", got)
	}
	if p.RouterIP() != ip("10.0.2.1") {
		t.Errorf("router IP = %v, want the first usable of the first CIDR", p.RouterIP())
	}
}

// Fill the pool from several goroutines that also release some of what
// they got: in the end every usable address is held exactly once, and none
// is the router, network or broadcast address.
func TestConcurrentAllocate(t *testing.T) {
	p := mustNew(t, "10.0.0.0/23", "10.0.4.0/24")
	const workers = 8
	held := make([][]netip.Addr, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				a, err := p.Allocate(fmt.Sprintf("ns/w%d-%d", w, i))
				if errors.Is(err, ErrPoolExhausted) {
					return
				}
				if err != nil {
					t.Error(err)
					return
				}
				if i%3 == 0 { // churn: give it back
					if err := p.Release(a); err != nil {
						t.Error(err)
						return
					}
					continue
				}
				held[w] = append(held[w], a)
			}
		}()
	}
	wg.Wait()
	seen := map[netip.Addr]bool{}
	for _, addrs := range held {
		for _, a := range addrs {
			if seen[a] {
				t.Fatalf("%v handed out twice", a)
			}
			seen[a] = true
		}
	}
	if len(seen) != p.Capacity()-1 || p.Used() != p.Capacity() {
		t.Errorf("held %d, used %d, capacity %d", len(seen), p.Used(), p.Capacity())
	}
	for _, s := range []string{"10.0.0.0", "10.0.0.1", "10.0.1.255", "10.0.4.0", "10.0.4.255"} {
		if seen[ip(s)] {
			t.Errorf("handed out %s", s)
		}
	}
	if len(p.Dump()) != p.Capacity() {
		t.Errorf("Dump has %d entries, want %d", len(p.Dump()), p.Capacity())
	}
}
