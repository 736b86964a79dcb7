package policy

import (
	"github.com/cilium/statedb"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/statedb/identity"
)

// EndpointStatus returns the status.policy that endpoint id, whose current
// identity is ident, shows in its CiliumEndpoint and in the agent API: the
// policy engine's row for it in the desired endpoint policy table, in
// CEPStatus's form without identity labels. It is nil while the engine has
// no row for the endpoint, or only one computed for another identity (the
// endpoint was relabelled and its policy is being recomputed), so a stale
// policy is never shown. The CEP synchronizer and the endpoint API both call
// it, which keeps the two views equal.
func EndpointStatus(txn statedb.ReadTxn, t statedb.Table[*EndpointPolicyRow], id uint16, ident identity.NumericIdentity) *ciliumv2.EndpointPolicy {
	row, _, ok := t.Get(txn, EndpointIDIndex.Query(id))
	if !ok || row.Policy == nil || row.Identity != ident || ident == identity.InvalidIdentity {
		return nil
	}
	return row.Policy.CEPStatus(nil)
}
