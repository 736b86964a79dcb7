package pool

import (
	"errors"
	"net/netip"
	"testing"
)

// FuzzOperations runs a random sequence of operations against a pool and a
// map that models it: the pool never hands out an address twice, never
// hands out network, broadcast or router addresses, and reports exhaustion
// exactly when the model is full.
func FuzzOperations(f *testing.F) {
	f.Add([]byte{0, 0, 0, 1, 5, 2, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{1, 3, 1, 3, 2, 3, 0, 2, 200})
	f.Fuzz(func(t *testing.T, ops []byte) {
		p := mustNew(t, "10.0.1.0/29", "10.0.2.0/30")
		// Addresses a test may name: both ranges plus neighbours.
		var candidates []netip.Addr
		for _, base := range []string{"10.0.1.0", "10.0.2.0"} {
			a := netip.MustParseAddr(base)
			for range 9 {
				candidates = append(candidates, a)
				a = a.Next()
			}
		}
		usable := func(a netip.Addr) bool {
			_, _, err := p.locate(a)
			return err == nil
		}
		model := map[netip.Addr]string{p.RouterIP(): RouterOwner}
		for i := 0; i+1 < len(ops); i += 2 {
			op, arg := ops[i]%3, int(ops[i+1])
			owner := string(rune('a' + arg%4))
			switch op {
			case 0:
				a, err := p.Allocate(owner)
				if len(model) == p.Capacity() {
					if !errors.Is(err, ErrPoolExhausted) {
						t.Fatalf("full pool: Allocate = %v, %v", a, err)
					}
					continue
				}
				if err != nil {
					t.Fatalf("Allocate with %d/%d used: %v", len(model), p.Capacity(), err)
				}
				if _, taken := model[a]; taken || !usable(a) {
					t.Fatalf("Allocate handed out %v (taken %v)", a, taken)
				}
				model[a] = owner
			case 1:
				a := candidates[arg%len(candidates)]
				err := p.AllocateIP(a, owner)
				cur, taken := model[a]
				switch {
				case !usable(a):
					if !errors.Is(err, ErrNotInPool) {
						t.Fatalf("AllocateIP(%v) = %v, want ErrNotInPool", a, err)
					}
				case taken && cur != owner:
					if !errors.Is(err, ErrInUse) {
						t.Fatalf("AllocateIP(%v) = %v, want ErrInUse", a, err)
					}
				default:
					if err != nil {
						t.Fatalf("AllocateIP(%v) = %v", a, err)
					}
					model[a] = owner
				}
			case 2:
				a := candidates[arg%len(candidates)]
				err := p.Release(a)
				switch {
				case !usable(a):
					if !errors.Is(err, ErrNotInPool) {
						t.Fatalf("Release(%v) = %v, want ErrNotInPool", a, err)
					}
				case a == p.RouterIP():
					if !errors.Is(err, ErrReserved) {
						t.Fatalf("Release(router) = %v, want ErrReserved", err)
					}
				default:
					if err != nil {
						t.Fatalf("Release(%v) = %v", a, err)
					}
					delete(model, a)
				}
			}
			dump := p.Dump()
			if len(dump) != len(model) || p.Used() != len(model) {
				t.Fatalf("pool holds %d (used %d), model %d", len(dump), p.Used(), len(model))
			}
			for a, o := range model {
				if dump[a] != o {
					t.Fatalf("%v: pool owner %q, model %q", a, dump[a], o)
				}
			}
		}
	})
}
