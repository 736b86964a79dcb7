// Package lbmode is how the kube-proxy replacement sends a connection
// from outside the node to a backend on another node (Cilium's
// --bpf-lb-mode and --bpf-lb-dsr-dispatch): with SNAT (the source
// translated to the node, the replies back through it), with direct
// server return (the client's address kept, the frontend carried to the
// backend's node in an IPv4 option, the replies straight from there to
// the client), or hybrid (DSR for TCP, SNAT for UDP). bpf/nodeport.c
// does it (bpf/include/dsr.h); this package holds the flags and their
// checks.
package lbmode

import (
	"fmt"

	"github.com/spf13/pflag"

	"github.com/cellium/cellium/datapath/bpf"
)

// Modes (--bpf-lb-mode) and DSR dispatch methods (--bpf-lb-dsr-dispatch),
// Cilium's values.
const (
	ModeSNAT   = "snat"
	ModeDSR    = "dsr"
	ModeHybrid = "hybrid"

	DispatchOption = "opt"
	DispatchIPIP   = "ipip"
	DispatchGeneve = "geneve"
)

// Flag names (Cilium's).
const (
	ModeFlag     = "bpf-lb-mode"
	DispatchFlag = "bpf-lb-dsr-dispatch"
)

// Config is the load-balancing mode for remote backends.
type Config struct {
	// Mode is ModeSNAT, ModeDSR or ModeHybrid.
	Mode string `flag:"bpf-lb-mode"`
	// DSRDispatch is how the frontend reaches the backend's node with DSR:
	// DispatchOption only (Cilium's ipip and geneve are refused).
	DSRDispatch string `flag:"bpf-lb-dsr-dispatch"`
}

// DefaultConfig is Cilium's: SNAT, option dispatch.
var DefaultConfig = Config{Mode: ModeSNAT, DSRDispatch: DispatchOption}

// Flags registers --bpf-lb-mode and --bpf-lb-dsr-dispatch.
func (def Config) Flags(fs *pflag.FlagSet) {
	fs.String(ModeFlag, def.Mode,
		`How the kube-proxy replacement sends a NodePort, LoadBalancer or externalIP connection to a backend on another node: "snat" (source translated to the node, replies back through it), "dsr" (direct server return: the client's address kept, the replies leave the backend's node straight to the client; needs --routing-mode=native) or "hybrid" (DSR for TCP, SNAT for UDP)`)
	fs.String(DispatchFlag, def.DSRDispatch,
		`How DSR carries the Service address and port to the backend's node: "opt" (an IPv4 option, Cilium's format)`)
}

// Validate implements hive.Validator.
func (c Config) Validate() error {
	switch c.Mode {
	case ModeSNAT, ModeDSR, ModeHybrid:
	default:
		return fmt.Errorf("invalid --%s=%q: want %q, %q or %q", ModeFlag, c.Mode, ModeSNAT, ModeDSR, ModeHybrid)
	}
	switch c.DSRDispatch {
	case DispatchOption:
	case DispatchIPIP, DispatchGeneve:
		return fmt.Errorf("invalid --%s=%s: cellium supports %q only (the IPv4 option, with --routing-mode=native)",
			DispatchFlag, c.DSRDispatch, DispatchOption)
	default:
		return fmt.Errorf("invalid --%s=%q: want %q", DispatchFlag, c.DSRDispatch, DispatchOption)
	}
	return nil
}

// UsesDSR reports whether some connections go by DSR (dsr or hybrid).
func (c Config) UsesDSR() bool { return c.Mode == ModeDSR || c.Mode == ModeHybrid }

// CheckRouting refuses DSR with tunnel routing, as Cilium does: there DSR
// needs --bpf-lb-dsr-dispatch=geneve and --tunnel-protocol=geneve, and
// cellium tunnels with VXLAN only, with which Cilium allows snat alone.
// routingMode is --routing-mode ("tunnel" or "native").
func (c Config) CheckRouting(routingMode string) error {
	if routingMode == "tunnel" && c.Mode != ModeSNAT {
		return fmt.Errorf("--%s=%s cannot be used with --routing-mode=tunnel (vxlan): use --routing-mode=native for DSR, or --%s=%s (Cilium's tunnel DSR needs --%s=%s with --tunnel-protocol=geneve, which cellium does not support)",
			ModeFlag, c.Mode, ModeFlag, ModeSNAT, DispatchFlag, DispatchGeneve)
	}
	return nil
}

// Datapath is the mode as bpf/nodeport.c's NODEPORT_LB_MODE.
func (c Config) Datapath() uint8 {
	switch c.Mode {
	case ModeDSR:
		return bpf.LBModeDSR
	case ModeHybrid:
		return bpf.LBModeHybrid
	}
	return bpf.LBModeSNAT
}
