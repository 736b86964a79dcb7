package soak

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"syscall"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/cellium/cellium/test/devkubelet/devnode"
	"github.com/cellium/cellium/test/harness"
	"github.com/cellium/cellium/test/realnode"
)

// podRange is the operator's pod address space (Start).
var podRange = netip.MustParsePrefix("10.231.0.0/16")

// hostSysctls are the settings of this machine's namespace the agent
// changes with host routing; the soak writes them back after the run.
var hostSysctls = []string{"net/ipv4/ip_forward", "net/ipv4/conf/all/rp_filter"}

// takeHostNetwork prepares the machine for an agent with host routing:
// the machine-wide host-network lock (one host-routing agent at a time),
// no cilium_host of an agent that does not hold it, the sysctls saved,
// and blackhole routes for the pod and Service ranges, so that nothing
// of them ever leaves the machine. giveBackHostNetwork undoes it.
func (s *Soak) takeHostNetwork(ctx context.Context) error {
	unlock, err := harness.LockHostNetwork(ctx, func() {
		s.cfg.Logf("soak: waiting for another host-routing test or real node on this machine to finish")
	})
	if err != nil {
		return fmt.Errorf("soak: %w", err)
	}
	s.unlockHost = unlock
	if err := realnode.WaitHostFree(ctx, false, true, harness.TextLogger(logfWriter(s.cfg.Logf))); err != nil {
		return fmt.Errorf("soak: %w", err)
	}
	s.sysctls = map[string][]byte{}
	for _, p := range hostSysctls {
		v, err := os.ReadFile(filepath.Join("/proc/sys", p))
		if err != nil {
			return fmt.Errorf("soak: %w", err)
		}
		s.sysctls[p] = v
	}
	for _, p := range []netip.Prefix{podRange, s.cfg.ServiceRange} {
		if !p.IsValid() {
			continue
		}
		r := &netlink.Route{Dst: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), 32)},
			Type: syscall.RTN_BLACKHOLE, Table: syscall.RT_TABLE_MAIN}
		if err := s.hostNS.Do(func(ns.NetNS) error { return netlink.RouteAdd(r) }); err != nil {
			return fmt.Errorf("soak: blackhole %s: %w", p, err)
		}
		s.blackholes = append(s.blackholes, r)
	}
	return nil
}

// giveBackHostNetwork removes what the agent's host routing left in the
// machine's namespace (the agent is stopped), writes the sysctls back,
// removes the blackholes and releases the lock.
func (s *Soak) giveBackHostNetwork(ctx context.Context) error {
	if s.unlockHost == nil {
		return nil // never held: what is there is another agent's
	}
	var errs []error
	if s.node != nil {
		errs = append(errs, s.hostNS.Do(func(ns.NetNS) error { return devnode.RemoveAgentHostNetwork(ctx) }))
	}
	for p, v := range s.sysctls {
		errs = append(errs, os.WriteFile(filepath.Join("/proc/sys", p), v, 0))
	}
	for _, r := range s.blackholes {
		if err := s.hostNS.Do(func(ns.NetNS) error { return netlink.RouteDel(r) }); err != nil {
			errs = append(errs, fmt.Errorf("remove blackhole %s: %w", r.Dst, err))
		}
	}
	s.blackholes = nil
	if s.unlockHost != nil {
		s.unlockHost()
		s.unlockHost = nil
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("give the host network back: %w", err)
	}
	return nil
}

// logfWriter writes a logger's lines to Config.Logf.
type logfWriter func(format string, args ...any)

func (w logfWriter) Write(p []byte) (int, error) {
	w("%s", string(p))
	return len(p), nil
}
