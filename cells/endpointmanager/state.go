package endpointmanager

import (
	"context"
	"fmt"

	"github.com/cilium/statedb"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/statedb/endpoints"
	statepolicy "github.com/cellium/cellium/statedb/policy"
)

// stateInputs is everything the state of an endpoint in service (identity
// resolved) is derived from: the endpoint's own row and the status other
// subsystems keep in their tables. To let another subsystem hold an
// endpoint back from ready (the loader's programs, the datapath's realized
// policy map), add its status here and a gate in nextState's regenerating
// case.
type stateInputs struct {
	// Endpoint is the endpoint's row: its state, identity and the policy
	// revision it has taken.
	Endpoint *endpoints.Endpoint
	// Policy is the policy cell's row for the endpoint (nil: none yet).
	Policy *statepolicy.EndpointPolicyRow
}

// stateStep is an endpoint's next state, the policy revision it carries
// in that state, and the message logged with the change.
type stateStep struct {
	State          ciliumv2.EndpointState
	PolicyRevision uint64
	PolicyRestored bool
	Message        string
}

// nextState is one step of an endpoint's regeneration, as in Cilium:
//
//	ready -> waiting-to-regenerate   its policy is out of date: the policy
//	                                 cell has no row for its identity, or
//	                                 marked the row pending
//	waiting-to-regenerate -> regenerating   the policy is computed
//	ready -> regenerating            a policy of another revision is computed
//	regenerating -> ready            the endpoint takes the computed policy
//	                                 and its revision
//	waiting-to-regenerate -> ready   a restored endpoint without a policy of
//	                                 this run: the previous run's stays
//
// It returns false when the endpoint stays as it is: at rest (ready with
// the computed revision, or still waiting), not in service
// (waiting-for-identity, restoring, disconnecting, invalid: the manager's
// own states), or resolving the identity of changed labels. Applied repeatedly it reaches a fixed point.
func nextState(in stateInputs) (stateStep, bool) {
	ep, row := in.Endpoint, in.Policy
	if !ep.InService() || ep.IdentityPending {
		return stateStep{}, false
	}
	cur := stateStep{State: ep.State, PolicyRevision: ep.PolicyRevision, PolicyRestored: ep.PolicyRestored}
	next := cur
	switch {
	case !row.Computed(ep.Identity) && ep.PolicyRestored:
		// Restored: the previous run's policy stays until this run's.
		next.State = ciliumv2.EndpointStateReady
		next.Message = "Restored endpoint keeps the policy of the previous run until its policy is computed"
	case !row.Computed(ep.Identity):
		next.State = ciliumv2.EndpointStateWaitingToRegenerate
		next.Message = waitingMessage(ep, row)
	case ep.State == ciliumv2.EndpointStateWaitingToRegenerate,
		ep.State == ciliumv2.EndpointStateReady && (ep.PolicyRevision != row.Policy.Revision || ep.PolicyRestored):
		next.State = ciliumv2.EndpointStateRegenerating
		next.Message = fmt.Sprintf("Regenerating endpoint: policy revision %d computed", row.Policy.Revision)
	case ep.State == ciliumv2.EndpointStateRegenerating:
		// Gates on the datapath go here, once it reports their status.
		next.State = ciliumv2.EndpointStateReady
		next.PolicyRevision = row.Policy.Revision
		next.PolicyRestored = false
		next.Message = fmt.Sprintf("Successfully regenerated endpoint (policy revision %d)", row.Policy.Revision)
	}
	return next, next.State != cur.State || next.PolicyRevision != cur.PolicyRevision || next.PolicyRestored != cur.PolicyRestored
}

func waitingMessage(ep *endpoints.Endpoint, row *statepolicy.EndpointPolicyRow) string {
	switch {
	case row == nil || row.Policy == nil:
		return "Waiting for the endpoint's policy to be computed"
	case row.Identity != ep.Identity:
		return fmt.Sprintf("Waiting for the policy of identity %s to be computed", ep.Identity.StringID())
	}
	return fmt.Sprintf("Policy revision %d affects the endpoint, waiting to regenerate", row.PendingRevision)
}

// stepState applies nextState to endpoint id until it rests, one commit
// per step, so each state shows in the table (and in the endpoint's log).
// These derived changes are not written to the state file: a restored
// endpoint derives them again.
func (m *Manager) stepState(id uint16) {
	for range 4 { // at most waiting -> regenerating -> ready, plus one
		txn := m.db.WriteTxn(m.table)
		cur, _, ok := m.table.Get(txn, endpoints.IDIndex.Query(id))
		if !ok {
			txn.Abort()
			return
		}
		row, _, _ := m.policies.Get(txn, statepolicy.EndpointIDIndex.Query(id))
		step, changed := nextState(stateInputs{Endpoint: cur, Policy: row})
		if !changed {
			txn.Abort()
			return
		}
		c := cur.WithState(step.State, step.Message, m.now())
		c.PolicyRevision, c.PolicyRestored = step.PolicyRevision, step.PolicyRestored
		if _, _, err := m.table.Insert(txn, c); err != nil {
			txn.Abort()
			m.log.Warn("update endpoint state", "endpoint", id, "error", err)
			return
		}
		txn.Commit()
	}
}

// deriveStates is the job that keeps each endpoint's state in step with
// its policy: it re-derives an endpoint's state when its row or its policy
// row changes.
type deriveStates struct {
	m        *Manager
	eps      statedb.ChangeIterator[*endpoints.Endpoint]
	policies statedb.ChangeIterator[*statepolicy.EndpointPolicyRow]
}

func (d *deriveStates) subscribe() error {
	txn := d.m.db.WriteTxn(d.m.table, d.m.policies)
	defer txn.Commit()
	var err error
	if d.eps, err = d.m.table.Changes(txn); err != nil {
		return err
	}
	d.policies, err = d.m.policies.Changes(txn)
	return err
}

func (d *deriveStates) run(ctx context.Context, h hive.Health) {
	defer d.eps.Close()
	defer d.policies.Close()
	for {
		rtxn := d.m.db.ReadTxn()
		ids := map[uint16]struct{}{}
		epChanges, epWatch := d.eps.Next(rtxn)
		for c := range epChanges {
			if !c.Deleted {
				ids[c.Object.ID] = struct{}{}
			}
		}
		polChanges, polWatch := d.policies.Next(rtxn)
		for c := range polChanges {
			ids[c.Object.EndpointID] = struct{}{}
		}
		for id := range ids {
			d.m.stepState(id)
		}
		h.OK("in sync")
		select {
		case <-ctx.Done():
			return
		case <-epWatch:
		case <-polWatch:
		}
	}
}

// inServiceState is the state of an endpoint whose identity has just been
// resolved: it waits for its policy, or is ready at once when the agent
// runs without a policy engine.
func (m *Manager) inServiceState() (ciliumv2.EndpointState, string) {
	if m.policies == nil {
		return ciliumv2.EndpointStateReady, "Successfully regenerated endpoint program"
	}
	return ciliumv2.EndpointStateWaitingToRegenerate, "Identity resolved, waiting for its policy"
}
