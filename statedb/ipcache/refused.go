package ipcache

import (
	"fmt"
	"strconv"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
)

// RefusedTableName is the name of the table of refused CiliumEndpoints
// (`cellium statedb ipcache-refused-ceps`).
const RefusedTableName = "ipcache-refused-ceps"

// Refusal is why the claims of a CiliumEndpoint of another node are kept
// out of the ipcache; it is the reason label of the
// cellium_ipcache_cep_refused metrics. Anyone who may write a CEP could
// otherwise give any address any identity.
type Refusal string

// The refusals, in the order they are checked.
const (
	// RefusedReservedIdentity: status.identity.id is not a cluster-scope
	// identity a CiliumIdentity can stand for: below 256 (the reserved
	// identities host, world, health, remote-node, ... and the
	// user-reserved 128-255), node-local (CIDR, FQDN: scope 1<<24) or
	// remote-node scope (2<<24), negative, or beyond 32 bits.
	RefusedReservedIdentity Refusal = "reserved-identity"
	// RefusedUnknownIdentity: no CiliumIdentity has that number.
	RefusedUnknownIdentity Refusal = "unknown-identity"
	// RefusedNamespaceMismatch: the CiliumIdentity's namespace label
	// (k8s:io.kubernetes.pod.namespace) is not the CEP's namespace, or it
	// has none.
	RefusedNamespaceMismatch Refusal = "namespace-mismatch"
	// RefusedUnknownNode: status.networking.node is no node's InternalIP
	// (from the nodes' CiliumNodes).
	RefusedUnknownNode Refusal = "unknown-node"
	// RefusedAddressOutsideNode: an address of status.networking.addressing
	// is outside the pod CIDRs of the node the CEP names, or does not parse.
	RefusedAddressOutsideNode Refusal = "address-outside-node"
)

// RefusedCEP is a row of the refused-CEPs table: a CiliumEndpoint of
// another node whose claims the ipcache refuses now. The ipcache cell is
// its only writer; the doctor reads it. Rows are immutable.
type RefusedCEP struct {
	// CEP is namespace/name.
	CEP string `json:"cep"`
	// Reason is why.
	Reason Refusal `json:"reason"`
	// Identity and NodeIP are what its status claims.
	Identity int64  `json:"identity"`
	NodeIP   string `json:"node-ip"`
}

// TableHeader implements statedb.TableWritable.
func (*RefusedCEP) TableHeader() []string {
	return []string{"CEP", "Reason", "Identity", "NodeIP"}
}

// TableRow implements statedb.TableWritable.
func (r *RefusedCEP) TableRow() []string {
	return []string{r.CEP, string(r.Reason), strconv.FormatInt(r.Identity, 10), r.NodeIP}
}

// RefusedCEPIndex is the refused-CEPs table's primary index: the CEP's
// namespace/name.
var RefusedCEPIndex = statedb.Index[*RefusedCEP, string]{
	Name:       "cep",
	FromObject: func(r *RefusedCEP) index.KeySet { return index.NewKeySet(index.String(r.CEP)) },
	FromKey:    index.String,
	FromString: index.FromString,
	Unique:     true,
}

// NewRefusedTable creates and registers the refused-CEPs table.
func NewRefusedTable(db *statedb.DB) (statedb.RWTable[*RefusedCEP], error) {
	t, err := statedb.NewTable(db, RefusedTableName, RefusedCEPIndex)
	if err != nil {
		return nil, fmt.Errorf("create table %s: %w", RefusedTableName, err)
	}
	return t, nil
}
