package maps

import (
	"fmt"

	"github.com/cilium/ebpf"

	"github.com/cellium/cellium/datapath/bpf"
)

// PolicyProgram is the name of the program of an endpoint's collection
// that goes into PolicyProgs (cil_lxc_policy).
const PolicyProgram = bpf.LxcProgCilLxcPolicy

// PolicyProgs is cellium_policy_progs, the prog array of the endpoints'
// cil_lxc_policy programs indexed by endpoint ID. A packet from one local
// pod to another is checked against the destination's ingress policy by
// its program and redirected into the destination pod, skipping the host
// stack; while an endpoint has no program here, packets to it take the
// stack and its attached cil_to_container. The loader sets an endpoint's
// slot after attaching its programs (and after every reload) and deletes
// it when the endpoint goes.
type PolicyProgs struct{ m *ebpf.Map }

// Map returns the underlying map.
func (p *PolicyProgs) Map() *ebpf.Map { return p.m }

// Set puts prog, the endpoint's cil_lxc_policy, into slot epID, replacing
// any program there. The map holds its own reference: prog may be closed.
func (p *PolicyProgs) Set(epID uint16, prog *ebpf.Program) error {
	if err := p.m.Update(uint32(epID), prog, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("set policy program of endpoint %d: %w", epID, err)
	}
	return nil
}

// Delete empties slot epID; an empty slot is not an error.
func (p *PolicyProgs) Delete(epID uint16) error {
	if err := p.m.Delete(uint32(epID)); err != nil && !isNotExist(err) {
		return fmt.Errorf("delete policy program of endpoint %d: %w", epID, err)
	}
	return nil
}

// Has reports whether slot epID holds a program.
func (p *PolicyProgs) Has(epID uint16) (bool, error) {
	var id uint32
	err := p.m.Lookup(uint32(epID), &id)
	if isNotExist(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("look up policy program of endpoint %d: %w", epID, err)
	}
	return true, nil
}
