// Package bpfprog defines the bpf-programs table: one row per local
// endpoint whose eBPF programs the datapath must load and attach to its
// host-side veth, with the load-time constants of those programs and the
// reconciliation status (a verifier error lands there, with its log).
//
// The rows are derived from the endpoints table (see Derive) by the
// loader (datapath/loader), which is also the only writer of their
// status. Control-plane cells (the endpoint manager, the CEP
// synchronizer, the doctor) read the status through this package without
// importing the datapath.
package bpfprog

import (
	"fmt"
	"net/netip"
	"strconv"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/reconciler"
)

// TableName is the table's name.
const TableName = "bpf-programs"

// Program is the desired datapath of one endpoint: cil_from_container
// and cil_to_container attached to the host veth HostIfName, loaded with
// the constants below. Rows are immutable: copy, then insert.
type Program struct {
	// EndpointID is the endpoint (ENDPOINT_ID).
	EndpointID uint16 `json:"endpoint-id"`
	// HostIfName is the host-side veth the programs attach to.
	HostIfName string `json:"interface-name"`
	// HostIfIndex is its ifindex as the endpoint recorded it
	// (ENDPOINT_IFINDEX, unless the link by that name has another index
	// now: the loader always uses the link's current index). A veth
	// re-created under the same name is a change of the row.
	HostIfIndex int `json:"interface-index,omitempty"`
	// Identity is the endpoint's security identity (SECURITY_IDENTITY).
	Identity identity.NumericIdentity `json:"identity"`
	// MAC is the endpoint's (pod-side) MAC address (ENDPOINT_MAC), "" if
	// unknown.
	MAC string `json:"mac,omitempty"`
	// IPv4 is the endpoint's address (ENDPOINT_IPV4): the programs drop
	// what the pod sends from any other.
	IPv4 netip.Addr `json:"ipv4,omitzero"`
	// AuditMode is POLICY_AUDIT_MODE: verdicts are logged, nothing is
	// dropped by policy (--policy-audit-mode).
	AuditMode bool `json:"audit-mode,omitempty"`
	// Status is the reconciliation status: Done once both programs are
	// attached as described; Error with the verifier's log when loading
	// failed.
	Status reconciler.Status `json:"status"`
}

// SameAs reports whether p and o differ at most in Status.
func (p *Program) SameAs(o *Program) bool {
	return p.EndpointID == o.EndpointID && p.HostIfName == o.HostIfName && p.HostIfIndex == o.HostIfIndex &&
		p.Identity == o.Identity && p.MAC == o.MAC && p.IPv4 == o.IPv4 && p.AuditMode == o.AuditMode
}

// WithStatus returns a copy of p with status s.
func (p *Program) WithStatus(s reconciler.Status) *Program {
	c := *p
	c.Status = s
	return &c
}

// TableHeader implements statedb.TableWritable.
func (*Program) TableHeader() []string {
	return []string{"Endpoint", "Interface", "Identity", "Audit", "Status"}
}

// TableRow implements statedb.TableWritable.
func (p *Program) TableRow() []string {
	return []string{strconv.Itoa(int(p.EndpointID)), fmt.Sprintf("%s (%d)", p.HostIfName, p.HostIfIndex),
		strconv.Itoa(int(p.Identity)), strconv.FormatBool(p.AuditMode), p.Status.String()}
}

// EndpointIDIndex is the primary index: the endpoint ID.
var EndpointIDIndex = statedb.Index[*Program, uint16]{
	Name:       "endpoint-id",
	FromObject: func(p *Program) index.KeySet { return index.NewKeySet(index.Uint16(p.EndpointID)) },
	FromKey:    index.Uint16,
	FromString: index.Uint16String,
	Unique:     true,
}

// NewTable creates the bpf-programs table.
func NewTable(db *statedb.DB) (statedb.RWTable[*Program], error) {
	return statedb.NewTable(db, TableName, EndpointIDIndex)
}

// Derive is the desired program row of ep, or nil when ep needs none: it
// needs one once it has a host veth and a resolved identity, and until it
// is being deleted. The health endpoint is no exception. auditMode is
// --policy-audit-mode.
func Derive(ep *endpoints.Endpoint, auditMode bool) *Program {
	if ep.HostIfName == "" || ep.Identity == identity.InvalidIdentity {
		return nil
	}
	switch ep.State {
	case ciliumv2.EndpointStateDisconnecting, ciliumv2.EndpointStateDisconnected, ciliumv2.EndpointStateInvalid:
		return nil
	}
	return &Program{
		EndpointID: ep.ID, HostIfName: ep.HostIfName, HostIfIndex: ep.HostIfIndex,
		Identity: ep.Identity, MAC: ep.MAC, IPv4: ep.IPv4, AuditMode: auditMode,
	}
}

// State says how far the datapath of one endpoint is programmed, for its
// state and health.
type State int

const (
	// StateNone: the table has no row for the endpoint (no program is
	// wanted yet, or the loader is off).
	StateNone State = iota
	// StatePending: a row exists but is not attached as wanted for the
	// endpoint's current identity and interface.
	StatePending
	// StateFailed: the last attempt failed (Message says why, with the
	// verifier's log); the loader retries.
	StateFailed
	// StateReady: the programs for the current identity are attached.
	StateReady
)

// EndpointState returns how far the programs of ep are: ready only when
// the row derived from ep (same identity, same interface) is reconciled.
// The message is the row's error for StateFailed.
func EndpointState(txn statedb.ReadTxn, t statedb.Table[*Program], ep *endpoints.Endpoint) (State, string) {
	row, _, ok := t.Get(txn, EndpointIDIndex.Query(ep.ID))
	if !ok || row.Status.Kind == reconciler.StatusPendingDelete {
		return StateNone, ""
	}
	if row.Identity != ep.Identity || row.HostIfName != ep.HostIfName || row.HostIfIndex != ep.HostIfIndex {
		return StatePending, ""
	}
	switch row.Status.Kind {
	case reconciler.StatusDone:
		return StateReady, ""
	case reconciler.StatusError:
		return StateFailed, row.Status.Error
	}
	return StatePending, ""
}

// Health is the endpoint's `.status.health.bpf` as its CEP shows it: OK
// once its programs are attached for its identity, Failure while loading
// them fails, Pending before, Disabled without the loader (t nil) or for
// an endpoint that gets no programs.
func Health(txn statedb.ReadTxn, t statedb.Table[*Program], ep *endpoints.Endpoint) ciliumv2.EndpointHealthStatus {
	if t == nil || Derive(ep, false) == nil {
		return ciliumv2.EndpointHealthDisabled
	}
	switch st, _ := EndpointState(txn, t, ep); st {
	case StateReady:
		return ciliumv2.EndpointHealthOK
	case StateFailed:
		return ciliumv2.EndpointHealthFailure
	}
	return ciliumv2.EndpointHealthPending
}
