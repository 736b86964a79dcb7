package mapsync

import (
	"context"
	"fmt"
	"iter"

	"github.com/cilium/statedb"

	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/mapstate"
	"github.com/cellium/cellium/statedb/policy"
	"github.com/cellium/cellium/statedb/reconciler"
	"github.com/cellium/cellium/statedb/routes"
	"github.com/cellium/cellium/statedb/tables"
)

// Tables are the tables the deriver reads and writes.
type Tables struct {
	DB        *statedb.DB
	Endpoints statedb.Table[*endpoints.Endpoint]
	Policies  statedb.Table[*policy.EndpointPolicyRow]
	LXC       statedb.RWTable[*mapstate.Endpoint]
	PolicyMap statedb.RWTable[*mapstate.PolicyMap]
}

// Deriver keeps the lxc-map and policy-maps tables derived from the
// endpoints and endpoint-policies tables:
//
//   - lxc-map: one row per endpoint with an IPv4 address and a host veth
//     (an address two endpoints claim goes to the lower ID);
//   - policy-maps: one row per endpoint that exists and has a computed
//     policy. A row whose policy row disappears while its endpoint still
//     exists is kept as it is (the map keeps enforcing the last policy);
//     the row goes with the endpoint. A new version of a row keeps the
//     Realized revision of the previous one: it is what the map holds.
type Deriver struct {
	t    Tables
	eps  statedb.ChangeIterator[*endpoints.Endpoint]
	pols statedb.ChangeIterator[*policy.EndpointPolicyRow]
	init tables.InitGate
}

// NewDeriver registers the deriver as the initializer of the two tables:
// they are initialized (and the maps pruned) only once the endpoints and
// endpoint-policies tables are. It starts nothing.
func NewDeriver(t Tables) *Deriver {
	wtxn := t.DB.WriteTxn(t.LXC, t.PolicyMap)
	d := &Deriver{t: t, init: tables.NewInitGate(
		t.LXC.RegisterInitializer(wtxn, "endpoints"),
		t.PolicyMap.RegisterInitializer(wtxn, "endpoint-policies"),
	)}
	wtxn.Commit()
	return d
}

// Subscribe starts following the input tables; call it in a start hook.
func (d *Deriver) Subscribe() error {
	wtxn := d.t.DB.WriteTxn(d.t.Endpoints, d.t.Policies)
	defer wtxn.Commit()
	var err error
	if d.eps, err = d.t.Endpoints.Changes(wtxn); err != nil {
		return fmt.Errorf("subscribe to %s: %w", d.t.Endpoints.Name(), err)
	}
	if d.pols, err = d.t.Policies.Changes(wtxn); err != nil {
		return fmt.Errorf("subscribe to %s: %w", d.t.Policies.Name(), err)
	}
	return nil
}

func (d *Deriver) close() {
	if d.eps != nil {
		d.eps.Close()
	}
	if d.pols != nil {
		d.pols.Close()
	}
}

// Run derives until ctx ends.
func (d *Deriver) Run(ctx context.Context, health reconciler.Health) {
	if d.eps == nil {
		if err := d.Subscribe(); err != nil {
			health.Degraded("subscribe", err)
			return
		}
	}
	defer d.close()
	tables.RunDeriver(ctx, health, "derive map tables", func(ws *statedb.WatchSet) (string, error) {
		epW, polW, initW, err := d.step()
		ws.Add(epW, polW, initW)
		return "derived", err
	})
}

// step consumes the changes up to now and writes the rows they affect.
func (d *Deriver) step() (epW, polW, initW <-chan struct{}, err error) {
	rtxn := d.t.DB.ReadTxn()
	touched := map[uint16]struct{}{}
	epCh, epW := d.eps.Next(rtxn)
	epsChanged := false
	for ch := range epCh {
		touched[ch.Object.ID], epsChanged = struct{}{}, true
	}
	polCh, polW := d.pols.Next(rtxn)
	for ch := range polCh {
		touched[ch.Object.EndpointID] = struct{}{}
	}
	initNow := false
	if d.init.Closed() {
		epInit, w1 := d.t.Endpoints.Initialized(rtxn)
		polInit, w2 := d.t.Policies.Initialized(rtxn)
		switch {
		case !epInit:
			initW = w1
		case !polInit:
			initW = w2
		default:
			initNow = true
		}
	}
	if len(touched) == 0 && !initNow {
		return epW, polW, initW, nil
	}

	wtxn := d.t.DB.WriteTxn(d.t.LXC, d.t.PolicyMap)
	defer wtxn.Abort()
	if epsChanged {
		if _, err := routes.Sync(wtxn, d.t.LXC, DeriveEndpoints(d.t.Endpoints.All(rtxn)), func(e *mapstate.Endpoint) reconciler.Status { return e.Status }); err != nil {
			return epW, polW, initW, fmt.Errorf("lxc-map: %w", err)
		}
	}
	for id := range touched {
		if err := d.syncPolicy(rtxn, wtxn, id); err != nil {
			return epW, polW, initW, fmt.Errorf("policy-maps: %w", err)
		}
	}
	if initNow {
		d.init.Open(wtxn)
	}
	wtxn.Commit()
	return epW, polW, initW, nil
}

// syncPolicy writes the policy-maps row of endpoint id.
func (d *Deriver) syncPolicy(rtxn statedb.ReadTxn, wtxn statedb.WriteTxn, id uint16) error {
	_, _, epFound := d.t.Endpoints.Get(rtxn, endpoints.IDIndex.Query(id))
	pol, _, polFound := d.t.Policies.Get(rtxn, policy.EndpointIDIndex.Query(id))
	cur, _, curFound := d.t.PolicyMap.Get(wtxn, mapstate.PolicyEndpointIndex.Query(id))
	pendingDelete := curFound && cur.Status.Kind == reconciler.StatusPendingDelete
	switch {
	case epFound && polFound:
		if curFound && !pendingDelete && cur.Policy == pol.Policy && cur.Identity == pol.Identity {
			return nil
		}
		row := mapstate.NewPolicyMap(pol)
		if curFound {
			row.Realized = cur.Realized
		}
		_, _, err := d.t.PolicyMap.Insert(wtxn, row)
		return err
	case !epFound && curFound && !pendingDelete:
		_, _, err := d.t.PolicyMap.Delete(wtxn, cur)
		return err
	}
	return nil
}

// DeriveEndpoints returns the lxc-map rows of the endpoints (in ID order):
// one per endpoint with an IPv4 address and a host veth; the first
// endpoint claiming an address has it.
func DeriveEndpoints(eps iter.Seq2[*endpoints.Endpoint, statedb.Revision]) []*mapstate.Endpoint {
	var out []*mapstate.Endpoint
	seen := map[string]bool{}
	for e := range eps {
		if !e.IPv4.IsValid() || e.HostIfIndex <= 0 || seen[e.IPv4.String()] {
			continue
		}
		seen[e.IPv4.String()] = true
		out = append(out, &mapstate.Endpoint{IP: e.IPv4, EndpointID: e.ID, IfIndex: uint32(e.HostIfIndex),
			MAC: e.MAC, NodeMAC: e.HostMAC, Identity: e.Identity})
	}
	return out
}
