package loader

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"net"
	"os"
	"strconv"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/statedb"
	"github.com/vishvananda/netlink"

	"github.com/cellium/cellium/datapath/bpf"
	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/statedb/bpfprog"
	"github.com/cellium/cellium/statedb/reconciler"
)

// Names of the programs and of the policy map template in the collection
// (BPF ABI v1).
const (
	// ProgFromContainer sees the packets leaving the pod (tcx ingress of
	// the host veth): the endpoint's egress policy.
	ProgFromContainer = "cil_from_container"
	// ProgToContainer sees the packets going to the pod (tcx egress of
	// the host veth): the endpoint's ingress policy.
	ProgToContainer = "cil_to_container"
	// PolicyTemplate is the policy map the collection declares; each load
	// replaces it with the endpoint's own pinned map.
	PolicyTemplate = "cellium_policy"
)

// SpecLoader returns the collection of the datapath programs
// (datapath/bpf's LoadLxc). Each call returns a spec the caller may modify.
type SpecLoader func() (*ebpf.CollectionSpec, error)

// Maps gives the programs the maps they share with the rest of the
// datapath, pinned in the agent's bpffs directory.
// PolicyPrograms is implemented by Maps that hold the prog array of the
// same-node redirect (cellium_policy_progs): a source endpoint's program
// tail-calls the destination's ingress policy program from its slot.
type PolicyPrograms interface {
	// SetPolicyProgram fills endpoint id's slot with prog.
	SetPolicyProgram(id uint16, prog *ebpf.Program) error
	// DeletePolicyProgram empties endpoint id's slot; an empty slot is
	// not an error.
	DeletePolicyProgram(id uint16) error
}

type Maps interface {
	// Global returns the global maps (cellium_ipcache, cellium_lxc, ...)
	// by name, opened or created from their pins. They stay owned by
	// Maps: the loader does not close them.
	Global() (map[string]*ebpf.Map, error)
	// Policy opens, creating it if missing, the policy map pinned for
	// endpoint id. The caller closes it.
	Policy(id uint16) (*ebpf.Map, error)
	// RemovePolicy unpins endpoint id's policy map; a missing one is not
	// an error.
	RemovePolicy(id uint16) error
}

// OpsConfig configures Ops.
type OpsConfig struct {
	// Layout is where bpffs is mounted; it must be mounted (MountBPFFS)
	// before the first operation.
	Layout Layout
	// Netns is the namespace of the host veths.
	Netns Netns
	// Spec loads the programs' collection.
	Spec SpecLoader
	// Maps gives the shared maps. Nil only for collections that declare
	// no policy map and no global map (tests).
	Maps Maps
	// Monitor is the monitor aggregation the programs trace with (the
	// zero value traces every packet).
	Monitor bpf.Monitor
	// KubeProxyReplacement loads the programs with the reverse
	// translation of NodePort replies (NODEPORT_ENABLED), as the uplink
	// program (NodePort) needs.
	KubeProxyReplacement bool
}

// hook is one attachment point of one program.
type hook struct {
	prog string
	tcx  ebpf.AttachType
	// parent is the clsact hook for the fallback.
	parent uint32
}

var hooks = [2]hook{
	{prog: ProgFromContainer, tcx: ebpf.AttachTCXIngress, parent: netlink.HANDLE_MIN_INGRESS},
	{prog: ProgToContainer, tcx: ebpf.AttachTCXEgress, parent: netlink.HANDLE_MIN_EGRESS},
}

// Mode is how programs are attached to a veth.
type Mode string

const (
	// ModeTCX: pinned tcx links.
	ModeTCX Mode = "tcx"
	// ModeClsact: direct-action filters on a clsact qdisc (kernels without
	// tcx, before 6.6).
	ModeClsact Mode = "clsact"
)

// applied is what the loader last attached for an endpoint.
type applied struct {
	row     bpfprog.Program // status cleared
	ifindex int
	mode    Mode
	progs   [2]ebpf.ProgramID
}

// Ops reconciles the bpf-programs table into the kernel: for every row,
// the programs loaded with the row's constants and attached to its veth.
// Use NewOps; the methods may be called from one goroutine at a time (the
// reconciler's).
type Ops struct {
	cfg OpsConfig

	mu      sync.Mutex
	applied map[uint16]applied
	// spec is the collection as Spec returned it, parsed once; each load
	// works on a copy.
	spec *ebpf.CollectionSpec
	// forceClsact skips tcx (tests of the fallback).
	forceClsact bool
}

// NewOps returns the operations of cfg. It does no I/O.
func NewOps(cfg OpsConfig) *Ops {
	return &Ops{cfg: cfg, applied: map[uint16]applied{}}
}

// Update implements reconciler.Operations: it makes the programs of p's
// endpoint attached to p's veth with p's constants. When they are
// already (a periodic full reconciliation), it does nothing; when other
// programs are attached through the endpoint's pinned links (a restarted
// agent, a new identity), it replaces them in place.
//
// Errors: the veth does not exist (ErrLinkNotFound), the verifier
// rejected a program (ErrVerifier, with the log), attaching failed.
func (o *Ops) Update(_ context.Context, _ statedb.ReadTxn, p *bpfprog.Program) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	row := *p
	row.Status = reconciler.Status{}
	err := o.cfg.Netns.do(func(h *netlink.Handle) error {
		l, err := linkByName(h, p.HostIfName)
		if err != nil {
			return err
		}
		if l == nil {
			return fmt.Errorf("%w: %s", ErrLinkNotFound, p.HostIfName)
		}
		ifindex := l.Attrs().Index
		if a, ok := o.applied[p.EndpointID]; ok && a.row == row && a.ifindex == ifindex && o.intact(h, p.EndpointID, a) {
			return nil
		}
		coll, err := o.load(p, ifindex)
		if err != nil {
			return err
		}
		defer coll.Close()
		a, err := o.attach(h, p.EndpointID, ifindex, coll)
		if err != nil {
			return err
		}
		// Then the same-node redirect may skip the stack to this
		// endpoint: its slot runs its ingress policy first.
		if pp, ok := o.cfg.Maps.(PolicyPrograms); ok && coll.Programs[maps.PolicyProgram] != nil {
			if err := pp.SetPolicyProgram(p.EndpointID, coll.Programs[maps.PolicyProgram]); err != nil {
				return fmt.Errorf("set the redirect slot: %w", err)
			}
		}
		a.row = row
		o.applied[p.EndpointID] = a
		return nil
	})
	if err != nil {
		return fmt.Errorf("programs of endpoint %d on %s: %w", p.EndpointID, p.HostIfName, err)
	}
	return nil
}

// load loads the collection for p with its constants and maps.
func (o *Ops) load(p *bpfprog.Program, ifindex int) (*ebpf.Collection, error) {
	if o.spec == nil {
		spec, err := o.cfg.Spec()
		if err != nil {
			return nil, fmt.Errorf("load collection spec: %w", err)
		}
		o.spec = spec
	}
	spec := o.spec.Copy()
	for _, name := range []string{ProgFromContainer, ProgToContainer} {
		if spec.Programs[name] == nil {
			return nil, fmt.Errorf("collection has no program %s: rebuild bpf/ (make bpf)", name)
		}
	}
	mac, err := parseMAC(p.MAC)
	if err != nil {
		return nil, err
	}
	consts := bpf.EndpointConstants{
		EndpointID: p.EndpointID, Identity: uint32(p.Identity), IfIndex: uint32(ifindex),
		MAC: mac, IPv4: p.IPv4, AuditMode: p.AuditMode,
		Trace: true, Aggregation: o.cfg.Monitor.Aggregation, ReportInterval: o.cfg.Monitor.ReportInterval,
		ReportFlags: o.cfg.Monitor.ReportFlags, NodePort: o.cfg.KubeProxyReplacement,
	}
	if err := consts.Apply(spec); err != nil {
		return nil, fmt.Errorf("%w: rebuild bpf/ (make bpf)", err)
	}
	opts := ebpf.CollectionOptions{
		Maps:            ebpf.MapOptions{PinPath: o.cfg.Layout.Dir()},
		MapReplacements: map[string]*ebpf.Map{},
	}
	if o.cfg.Maps != nil {
		global, err := o.cfg.Maps.Global()
		if err != nil {
			return nil, fmt.Errorf("open global maps: %w", err)
		}
		for name, m := range global {
			if spec.Maps[name] != nil {
				opts.MapReplacements[name] = m
			}
		}
	}
	if spec.Maps[PolicyTemplate] != nil {
		if o.cfg.Maps == nil {
			return nil, fmt.Errorf("collection declares %s but the loader has no maps to replace it", PolicyTemplate)
		}
		pm, err := o.cfg.Maps.Policy(p.EndpointID)
		if err != nil {
			return nil, fmt.Errorf("open policy map: %w", err)
		}
		defer pm.Close()
		opts.MapReplacements[PolicyTemplate] = pm
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, opts)
	if err != nil {
		return nil, loadError(err)
	}
	return coll, nil
}

// parseMAC parses the endpoint's MAC; "" is none.
func parseMAC(mac string) (net.HardwareAddr, error) {
	if mac == "" {
		return nil, nil
	}
	hw, err := net.ParseMAC(mac)
	if err != nil || len(hw) != 6 {
		return nil, fmt.Errorf("endpoint MAC %q is not a 6-byte MAC address", mac)
	}
	return hw, nil
}

// Delete implements reconciler.Operations: it detaches the programs of
// p's endpoint, removes its pins and its policy map. Whatever is already
// gone is not an error.
func (o *Ops) Delete(_ context.Context, _ statedb.ReadTxn, p *bpfprog.Program) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	err := o.cfg.Netns.do(func(h *netlink.Handle) error {
		var errs []error
		if l, err := linkByName(h, p.HostIfName); err != nil {
			errs = append(errs, err)
		} else if l != nil && (p.HostIfIndex == 0 || l.Attrs().Index == p.HostIfIndex) {
			errs = append(errs, removeFilters(h, l.Attrs().Index))
		}
		errs = append(errs, o.remove(p.EndpointID))
		return errors.Join(errs...)
	})
	if err != nil {
		return fmt.Errorf("remove programs of endpoint %d: %w", p.EndpointID, err)
	}
	return nil
}

// remove detaches and unpins endpoint id's links, removes its directory
// and its policy map.
func (o *Ops) remove(id uint16) error {
	delete(o.applied, id)
	var errs []error
	// First no packet is redirected to the endpoint any more.
	if pp, ok := o.cfg.Maps.(PolicyPrograms); ok {
		if err := pp.DeletePolicyProgram(id); err != nil {
			errs = append(errs, fmt.Errorf("empty the redirect slot: %w", err))
		}
	}
	for _, hk := range hooks {
		errs = append(errs, removeLinkPin(o.cfg.Layout.LinkPin(id, hk.prog)))
	}
	if err := os.Remove(o.cfg.Layout.EndpointDir(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	if o.cfg.Maps != nil {
		if err := o.cfg.Maps.RemovePolicy(id); err != nil {
			errs = append(errs, fmt.Errorf("remove policy map: %w", err))
		}
	}
	return errors.Join(errs...)
}

// Prune implements reconciler.Operations: it removes the links, pins and
// policy maps of the endpoints that have a directory of pinned links but
// are not desired (deleted while the agent was down). A policy map whose
// endpoint never had programs is left to the policy map's owner.
func (o *Ops) Prune(_ context.Context, _ statedb.ReadTxn, desired iter.Seq2[*bpfprog.Program, statedb.Revision]) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	want := map[uint16]bool{}
	for p := range desired {
		want[p.EndpointID] = true
	}
	have := map[uint16]bool{}
	entries, err := os.ReadDir(o.cfg.Layout.EndpointsDir())
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("list %s: %w", o.cfg.Layout.EndpointsDir(), err)
	}
	for _, e := range entries {
		if id, err := strconv.ParseUint(e.Name(), 10, 16); err == nil {
			have[uint16(id)] = true
		}
	}
	var errs []error
	for id := range have {
		if want[id] {
			continue
		}
		if err := o.remove(id); err != nil {
			errs = append(errs, fmt.Errorf("prune endpoint %d: %w", id, err))
		}
	}
	return errors.Join(errs...)
}
