package mapsync

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/cilium/statedb"

	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/mapstate"
	"github.com/cellium/cellium/statedb/policy"
)

// Under random churn of endpoints and their policies the derived tables
// follow the rules: lxc-map is DeriveEndpoints of the endpoints;
// policy-maps has the current policy of every endpoint that has one, keeps
// the last one of an endpoint whose policy went, and nothing for an
// endpoint that is gone.
func TestDeriverFollowsChurn(t *testing.T) {
	for seed := range uint64(10) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 2))
			db := statedb.New()
			eps, _ := endpoints.NewTable(db)
			pols, _ := policy.NewTable(db)
			lxc, _ := mapstate.NewEndpointsTable(db)
			pm, _ := mapstate.NewPoliciesTable(db)
			d := NewDeriver(Tables{DB: db, Endpoints: eps, Policies: pols, LXC: lxc, PolicyMap: pm})
			if err := d.Subscribe(); err != nil {
				t.Fatal(err)
			}
			defer d.close()
			want := map[uint16]*policy.EndpointPolicy{} // the model of policy-maps
			for round := range 50 {
				wtxn := db.WriteTxn(eps, pols)
				for range 1 + rng.IntN(6) {
					id := uint16(1 + rng.IntN(6))
					switch rng.IntN(4) {
					case 0:
						_, _, _ = eps.Insert(wtxn, &endpoints.Endpoint{ID: id, IPv4: netip.AddrFrom4([4]byte{10, 0, 0, byte(rng.IntN(4))}),
							HostIfIndex: rng.IntN(3), Identity: identity.NumericIdentity(1000 + rng.IntN(3))})
					case 1:
						_, _, _ = eps.Delete(wtxn, &endpoints.Endpoint{ID: id})
					case 2:
						_, _, _ = pols.Insert(wtxn, policyRow(id, uint64(round), nil))
					case 3:
						_, _, _ = pols.Delete(wtxn, &policy.EndpointPolicyRow{EndpointID: id})
					}
				}
				wtxn.Commit()
				if _, _, _, err := d.step(); err != nil {
					t.Fatal(err)
				}
				txn := db.ReadTxn()
				for id := range uint16(7) {
					_, _, epOK := eps.Get(txn, endpoints.IDIndex.Query(id))
					p, _, polOK := pols.Get(txn, policy.EndpointIDIndex.Query(id))
					switch {
					case !epOK:
						delete(want, id)
					case polOK:
						want[id] = p.Policy
					}
					row, _, ok := pm.Get(txn, mapstate.PolicyEndpointIndex.Query(id))
					if w, wok := want[id]; ok != wok || (ok && row.Policy != w) {
						t.Fatalf("round %d, endpoint %d: row %v (%+v), want %v", round, id, ok, row, wok)
					}
				}
				wantLXC := DeriveEndpoints(eps.All(txn))
				if n := lxc.NumObjects(txn); n != len(wantLXC) {
					t.Fatalf("round %d: %d lxc-map rows, want %d", round, n, len(wantLXC))
				}
				for _, w := range wantLXC {
					got, _, ok := lxc.Get(txn, mapstate.EndpointIPIndex.Query(w.IP))
					if !ok || !got.SameAs(w) {
						t.Fatalf("round %d: lxc-map %s = %+v, want %+v", round, w.IP, got, w)
					}
				}
			}
		})
	}
}
