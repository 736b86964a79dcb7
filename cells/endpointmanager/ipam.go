package endpointmanager

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/ipam"
	"github.com/cellium/cellium/statedb/endpoints"
	ipamtables "github.com/cellium/cellium/statedb/ipam"
)

// Addresses are claimed and released through the IPAM requests table
// (statedb/ipam Request): the manager inserts a request, waits for the
// IPAM cell's answer in the same row and deletes the row; the addresses of
// restored endpoints are OpHold rows, written with the table's
// initialization, before which IPAM hands out nothing.

// answerGrace is how long a caller whose context ended still waits for
// an answer under way (IPAM's own error, bounded by the same deadline,
// says more than the context's).
const answerGrace = time.Second

// releaseTimeout bounds the wait for IPAM's answer to a release, which
// IPAM answers at once while it runs (a caller without a deadline does not
// hang on a stopped agent).
const releaseTimeout = 30 * time.Second

// errNoAnswer: the IPAM cell did not answer in time.
var errNoAnswer = errors.New("no answer from IPAM")

// askIPAM asks req of IPAM and waits for the answer; the request is
// deleted either way. The error is IPAM's (errors.Is holds on its
// sentinels) or, when ctx ends first, ctx's.
func (m *Manager) askIPAM(ctx context.Context, req *ipamtables.Request) (ipamtables.RequestResult, error) {
	req.ID = m.ipamIDs.Add(1)
	if d, ok := ctx.Deadline(); ok {
		req.Deadline = d
	}
	txn := m.db.WriteTxn(m.ipamReqs)
	if _, _, err := m.ipamReqs.Insert(txn, req); err != nil {
		txn.Abort()
		return ipamtables.RequestResult{}, fmt.Errorf("ask IPAM to %s %v: %w", req.Op, req.IP, err)
	}
	txn.Commit()
	defer m.withdrawIPAM(req.ID)

	var grace <-chan time.Time
	done := ctx.Done()
	for {
		row, _, watch, ok := m.ipamReqs.GetWatch(m.db.ReadTxn(), ipamtables.RequestIDIndex.Query(req.ID))
		if ok && row.Result.Done {
			return row.Result, row.Result.Err
		}
		select {
		case <-watch:
		case <-done:
			done, grace = nil, time.After(answerGrace)
		case <-grace:
			return ipamtables.RequestResult{}, fmt.Errorf("%s %v: %w: %w", req.Op, req.IP, errNoAnswer, ctx.Err())
		}
	}
}

// withdrawIPAM deletes request id.
func (m *Manager) withdrawIPAM(id uint64) {
	txn := m.db.WriteTxn(m.ipamReqs)
	defer txn.Abort()
	if _, _, err := m.ipamReqs.Delete(txn, &ipamtables.Request{ID: id}); err != nil {
		m.log.Warn("delete IPAM request", "request", id, "error", err)
		return
	}
	txn.Commit()
}

// claimIP asks IPAM whether ip is allocated to owner and marks it used.
// Possible errors: ipam.ErrNotAllocated, ipam.ErrNotOwner, IPAM's others.
func (m *Manager) claimIP(ctx context.Context, ip netip.Addr, owner ipam.Owner) error {
	_, err := m.askIPAM(ctx, &ipamtables.Request{Op: ipamtables.OpClaim, IP: ip, Owner: owner.Name, ContainerID: owner.ContainerID})
	return err
}

// releaseOwned asks IPAM to free ip if owner holds it; released is false,
// with no error, when ip was free. Possible errors: ipam.ErrNotOwner,
// IPAM's others.
func (m *Manager) releaseOwned(ctx context.Context, ip netip.Addr, owner ipam.Owner) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, releaseTimeout)
	defer cancel()
	res, err := m.askIPAM(ctx, &ipamtables.Request{Op: ipamtables.OpReleaseOwned, IP: ip, Owner: owner.Name, ContainerID: owner.ContainerID})
	return len(res.Released) > 0, err
}

// releaseContainer asks IPAM to free every address allocated with
// containerID and returns them.
func (m *Manager) releaseContainer(ctx context.Context, containerID string) ([]ipamtables.Allocation, error) {
	ctx, cancel := context.WithTimeout(ctx, releaseTimeout)
	defer cancel()
	res, err := m.askIPAM(ctx, &ipamtables.Request{Op: ipamtables.OpReleaseContainer, ContainerID: containerID})
	return res.Released, err
}

// holdRestored writes the OpHold rows of the restored endpoints' addresses
// and marks the requests table initialized (done), in one transaction:
// IPAM then holds them before it hands out its first address.
func (m *Manager) holdRestored(restored []*endpoints.Endpoint, done func(statedb.WriteTxn)) error {
	txn := m.db.WriteTxn(m.ipamReqs)
	defer txn.Abort()
	for _, c := range restoredClaims(restored) {
		req := &ipamtables.Request{ID: m.ipamIDs.Add(1), Op: ipamtables.OpHold, IP: c.IP, Owner: c.Owner.Name, ContainerID: c.Owner.ContainerID}
		if _, _, err := m.ipamReqs.Insert(txn, req); err != nil {
			return fmt.Errorf("hold the address %v of a restored endpoint: %w", c.IP, err)
		}
	}
	done(txn)
	txn.Commit()
	return nil
}

// dropHolds deletes the OpHold rows once IPAM has answered them (it has
// then taken the addresses over).
func (m *Manager) dropHolds(ctx context.Context) error {
	for {
		txn := m.db.ReadTxn()
		pending := false
		var answered []*ipamtables.Request
		for req := range m.ipamReqs.List(txn, ipamtables.RequestOpIndex.Query(ipamtables.OpHold)) {
			if req.Result.Done {
				answered = append(answered, req)
			} else {
				pending = true
			}
		}
		if len(answered) > 0 {
			wtxn := m.db.WriteTxn(m.ipamReqs)
			for _, req := range answered {
				if _, _, err := m.ipamReqs.Delete(wtxn, req); err != nil {
					wtxn.Abort()
					return fmt.Errorf("delete IPAM hold %d: %w", req.ID, err)
				}
			}
			wtxn.Commit()
		}
		if !pending {
			return nil
		}
		_, watch := m.ipamReqs.AllWatch(txn)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-watch:
		}
	}
}
