package ipam

import (
	"errors"
	"fmt"

	ipamtables "github.com/cellium/cellium/statedb/ipam"
)

// Owner names that are not pods ("namespace/name").
const (
	// HealthOwner owns the address of the node's health endpoint.
	HealthOwner = ipamtables.HealthOwner
)

var (
	// ErrNoPodCIDR means this node has no pod CIDR yet: the operator has
	// not written spec.ipam.podCIDRs into its CiliumNode. The wrapping
	// message names the node and says what to check.
	ErrNoPodCIDR = errors.New("no pod CIDR")
	// ErrCIDRsChanged means the operator changed the node's pod CIDRs in a
	// way the running pool cannot follow (the first CIDR changed, or a
	// CIDR holding allocated addresses went away); the old CIDRs stay in
	// use until the agent restarts.
	ErrCIDRsChanged = errors.New("pod CIDRs changed")
)

// noPodCIDRError is the error of a wait for pod CIDRs that ended with
// cause (the context's error, or nil while still waiting).
func noPodCIDRError(node string, cause error) error {
	msg := fmt.Sprintf("%s for node %s yet: is cellium-operator running with --cluster-pool-ipv4-cidr?", ErrNoPodCIDR, node)
	if cause == nil {
		return &wrapped{msg: msg, errs: []error{ErrNoPodCIDR}}
	}
	return &wrapped{msg: msg + " (" + cause.Error() + ")", errs: []error{ErrNoPodCIDR, cause}}
}

// wrapped is an error with its own message that wraps several errors.
type wrapped struct {
	msg  string
	errs []error
}

func (w *wrapped) Error() string   { return w.msg }
func (w *wrapped) Unwrap() []error { return w.errs }

var (
	// ErrNotAllocated means the address is not allocated to anyone: an
	// endpoint can only use an address that POST /v1/ipam handed out.
	ErrNotAllocated = errors.New("IP not allocated")
	// ErrNotOwner means the address is allocated to another owner or
	// another container; the wrapping message names the holder.
	ErrNotOwner = errors.New("IP held by another owner")
)
