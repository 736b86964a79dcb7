package endpointmanager

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cilium/statedb"

	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/identity"
)

// Identities are asked for through the identity requests table
// (statedb/identity Request): the manager writes one row per endpoint
// with the labels it wants an identity for and waits for the identity
// allocator's answer in the same row; the row holds the endpoint's
// reference, and deleting it (with the endpoint, in the same transaction)
// drops it.

// errSuperseded: the request was asked again (new labels) or withdrawn
// while waiting; the newer question gets its own answer.
var errSuperseded = errors.New("identity request superseded")

// requestIdentity asks for the identity of ep's labels and waits for the
// answer. The request is written only while ep is still the endpoint of
// its ID with those labels (checked in the same transaction, so that a
// request never outlives its endpoint).
//
// Errors: the allocator's (for example its timeout), ctx's, errSuperseded
// and ErrNotFound (the endpoint went or changed before the request was
// written).
func (m *Manager) requestIdentity(ctx context.Context, ep *endpoints.Endpoint) (identity.NumericIdentity, error) {
	attempt := m.attempts.Add(1)
	txn := m.db.WriteTxn(m.requests)
	cur, _, ok := m.table.Get(txn, endpoints.IDIndex.Query(ep.ID))
	if !ok || !sameEndpoint(cur, ep) {
		txn.Abort()
		return 0, fmt.Errorf("%w: endpoint %d was deleted while resolving its identity", ErrNotFound, ep.ID)
	}
	if !cur.Labels.Equal(ep.Labels) {
		txn.Abort()
		return 0, errSuperseded
	}
	req := &identity.Request{Endpoint: ep.ID}
	if old, _, found := m.requests.Get(txn, identity.RequestEndpointIndex.Query(ep.ID)); found {
		c := *old
		req = &c
		// The restored number belongs to the saved labels: other labels
		// must not be handed it (the allocator would refuse them as a
		// conflict with the number's own labels, and the endpoint would
		// be stuck until the cluster's identities are listed).
		if !c.Labels.Equal(ep.Labels) {
			req.Restored = identity.InvalidIdentity
		}
	}
	req.Labels, req.Attempt = ep.Labels, attempt
	if _, _, err := m.requests.Insert(txn, req); err != nil {
		txn.Abort()
		return 0, fmt.Errorf("request the identity of endpoint %d: %w", ep.ID, err)
	}
	txn.Commit()
	asked := time.Now()

	for {
		row, _, watch, found := m.requests.GetWatch(m.db.ReadTxn(), identity.RequestEndpointIndex.Query(ep.ID))
		switch {
		case !found || row.Attempt != attempt:
			return 0, errSuperseded
		case row.Answered():
			if row.Result.Err != nil {
				return 0, row.Result.Err
			}
			return row.Result.ID, nil
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("no answer from the identity allocator to the request for labels %s (attempt %d) after %v (see the identity module in `cellium status`): %w",
				ep.Labels, attempt, time.Since(asked).Round(time.Millisecond), context.Cause(ctx))
		case <-watch:
		}
	}
}

// withdrawIdentity deletes the identity request of endpoint id, in the
// transaction that removes the endpoint.
func (m *Manager) withdrawIdentity(txn statedb.WriteTxn, id uint16) error {
	if _, _, err := m.requests.Delete(txn, &identity.Request{Endpoint: id}); err != nil {
		return fmt.Errorf("withdraw the identity request of endpoint %d: %w", id, err)
	}
	return nil
}

// restoreIdentityRequest is the request row of a restored endpoint that
// had identity id: it asks nothing yet (its labels are resolved again
// later) but hands the allocator the number to grant again while the
// cluster's identities are not listed.
func restoreIdentityRequest(ep *endpoints.Endpoint, id identity.NumericIdentity) *identity.Request {
	return &identity.Request{Endpoint: ep.ID, Labels: ep.Labels, Restored: id}
}
