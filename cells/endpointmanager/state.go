package endpointmanager

import (
	"context"
	"fmt"

	"github.com/cilium/statedb"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/statedb/bpfprog"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/mapstate"
	statepolicy "github.com/cellium/cellium/statedb/policy"
	"github.com/cellium/cellium/statedb/reconciler"
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
	// Programs is the state of the endpoint's eBPF programs; StateNone
	// when the agent loads none for it (no loader, or no veth).
	Programs bpfprog.State
	// WantsPolicyMap is true when the datapath writes the endpoint's
	// policy map (the BPF map reconcilers run); PolicyMap is its row
	// there (nil: none yet).
	WantsPolicyMap bool
	PolicyMap      *mapstate.PolicyMap
}

// datapathReason says what of the datapath the endpoint still waits for
// to take policy revision rev, or "" when nothing.
func (in stateInputs) datapathReason(rev uint64) string {
	switch in.Programs {
	case bpfprog.StatePending:
		return "its BPF programs are not attached yet"
	case bpfprog.StateFailed:
		return "its BPF programs failed to load"
	}
	if in.WantsPolicyMap && (in.PolicyMap == nil || in.PolicyMap.Identity != in.Endpoint.Identity || in.PolicyMap.Realized < rev) {
		return fmt.Sprintf("its policy map does not hold revision %d yet", rev)
	}
	return ""
}

// datapathFailure is the error of the policy map reconciler when it
// failed to write policy revision rev into the endpoint's map (its policy
// does not fit the map, which then fails closed: datapath/mapsync), or
// "" when it did not fail.
func (in stateInputs) datapathFailure(rev uint64) string {
	pm := in.PolicyMap
	if !in.WantsPolicyMap || pm == nil || pm.Identity != in.Endpoint.Identity || pm.Revision != rev ||
		pm.Status.Kind != reconciler.StatusError {
		return ""
	}
	return pm.Status.Error
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
//	regenerating -> not-ready        the datapath failed to take the
//	                                 computed revision (its policy map
//	                                 overflows and drops everything): the
//	                                 message says why
//	not-ready -> ready               the datapath took the computed revision
//	not-ready -> regenerating        a revision the datapath has not
//	                                 refused is computed
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
	case ep.State == ciliumv2.EndpointStateRegenerating, ep.State == ciliumv2.EndpointStateNotReady:
		rev := row.Policy.Revision
		if f := in.datapathFailure(rev); f != "" {
			// The datapath refused it: not-ready until it takes one.
			next.State = ciliumv2.EndpointStateNotReady
			next.Message = fmt.Sprintf("Policy revision %d is not enforced: %s", rev, f)
			break
		}
		if in.datapathReason(rev) != "" {
			// The datapath does not enforce it yet; a not-ready
			// endpoint tries again with another revision.
			next.State = ciliumv2.EndpointStateRegenerating
			next.Message = fmt.Sprintf("Regenerating endpoint: policy revision %d computed", rev)
			break
		}
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
		step, changed := nextState(m.stateInputs(txn, cur))
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
	// beforeRead (tests) runs at the start of each round, before its
	// snapshot is taken.
	beforeRead func()
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
	// The datapath tables' watch channels of the previous round's
	// snapshot: closed once either changed after it.
	var progWatch, mapWatch <-chan struct{}
	for {
		if d.beforeRead != nil {
			d.beforeRead()
		}
		rtxn := d.m.db.ReadTxn()
		// Looked at only now, after the snapshot: a change committed
		// between the wake-up and the snapshot is in the snapshot, and
		// its endpoints must be looked at again in this round, since
		// the watch channels taken below will not close for it.
		datapathChanged := closed(progWatch) || closed(mapWatch)
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
		// The datapath's tables (programs attached, policy maps written)
		// gate regenerating endpoints: look at those again when either
		// changes.
		progWatch, mapWatch = nil, nil
		if d.m.programs != nil {
			_, progWatch = d.m.programs.AllWatch(rtxn)
		}
		if d.m.policyMaps != nil {
			_, mapWatch = d.m.policyMaps.AllWatch(rtxn)
		}
		if datapathChanged {
			for ep := range d.m.table.All(rtxn) {
				if ep.State == ciliumv2.EndpointStateRegenerating || ep.State == ciliumv2.EndpointStateNotReady {
					ids[ep.ID] = struct{}{}
				}
			}
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
		case <-progWatch:
		case <-mapWatch:
		}
	}
}

// closed reports whether watch channel w (nil: none) is closed.
func closed(w <-chan struct{}) bool {
	if w == nil {
		return false
	}
	select {
	case <-w:
		return true
	default:
		return false
	}
}

// stateInputs gathers what endpoint ep's state derives from.
func (m *Manager) stateInputs(txn statedb.ReadTxn, ep *endpoints.Endpoint) stateInputs {
	in := stateInputs{Endpoint: ep, Programs: bpfprog.StateNone, WantsPolicyMap: m.policyMaps != nil}
	if m.policies != nil {
		in.Policy, _, _ = m.policies.Get(txn, statepolicy.EndpointIDIndex.Query(ep.ID))
	}
	if m.wantsPrograms(ep) {
		in.Programs, _ = bpfprog.EndpointState(txn, m.programs, ep)
		if in.Programs == bpfprog.StateNone {
			in.Programs = bpfprog.StatePending // the loader has no row for it yet
		}
	}
	if m.policyMaps != nil {
		in.PolicyMap, _, _ = m.policyMaps.Get(txn, mapstate.PolicyEndpointIndex.Query(ep.ID))
	}
	return in
}

// notReadyReason says why endpoint ep is not ready, for errors.
func (m *Manager) notReadyReason(txn statedb.ReadTxn, ep *endpoints.Endpoint) string {
	if ep.IdentityPending {
		return "its labels changed and their identity is being resolved"
	}
	in := m.stateInputs(txn, ep)
	row := in.Policy
	switch {
	case row.Computed(ep.Identity):
		if r := in.datapathReason(row.Policy.Revision); r != "" {
			return r
		}
		return fmt.Sprintf("its policy (revision %d) is computed, but its state was not derived from it", row.Policy.Revision)
	case m.policies == nil:
		return "its datapath is not programmed yet"
	case row == nil || row.Policy == nil:
		return "the policy engine has written no policy for it (it writes none until the policies and identities are listed: see the endpoint-policy module in `cellium status`)"
	case row.Identity != ep.Identity:
		return fmt.Sprintf("its policy row is for identity %s, not its own: the policy engine has not recomputed it", row.Identity.StringID())
	}
	return fmt.Sprintf("its policy (revision %d) is being recomputed for revision %d", row.Policy.Revision, row.PendingRevision)
}

// inServiceState is the state of endpoint ep whose identity has just been
// resolved: it waits for its policy; without a policy engine it is ready
// at once, or regenerating until its programs are attached.
func (m *Manager) inServiceState(ep *endpoints.Endpoint) (ciliumv2.EndpointState, string) {
	if m.policies != nil {
		return ciliumv2.EndpointStateWaitingToRegenerate, "Identity resolved, waiting for its policy"
	}
	if m.wantsPrograms(ep) {
		return ciliumv2.EndpointStateRegenerating, "Regenerating endpoint"
	}
	return ciliumv2.EndpointStateReady, "Successfully regenerated endpoint program"
}
