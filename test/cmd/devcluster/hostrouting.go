package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/cellium/cellium/datapath/healthep"
	"github.com/cellium/cellium/datapath/routing"
	"github.com/cellium/cellium/statedb/routes"
	"github.com/cellium/cellium/test/devkubelet/devnode"
)

// hostSysctls are the settings of this machine's network namespace that the
// agent changes when it programs host routing (--enable-endpoint-routes):
// up saves them, down puts them back.
var hostSysctls = []string{"net/ipv4/ip_forward", "net/ipv4/conf/all/rp_filter"}

// savedSysctlsFile, in the cluster's directory, holds "path value" lines.
const savedSysctlsFile = "host-sysctls.orig"

// saveHostSysctls records the current values of hostSysctls under procSys
// (/proc/sys) in dir, unless a record is already there.
func saveHostSysctls(dir, procSys string) error {
	file := filepath.Join(dir, savedSysctlsFile)
	if _, err := os.Stat(file); err == nil {
		return nil
	}
	var b strings.Builder
	for _, p := range hostSysctls {
		v, err := os.ReadFile(filepath.Join(procSys, p))
		if err != nil {
			return fmt.Errorf("save host sysctls: %w", err)
		}
		fmt.Fprintf(&b, "%s %s\n", p, strings.TrimSpace(string(v)))
	}
	return os.WriteFile(file, []byte(b.String()), 0o644)
}

// restoreHostSysctls writes back what saveHostSysctls recorded in dir, and
// reports whether there was a record (host routing was on).
func restoreHostSysctls(dir, procSys string) (bool, error) {
	f, err := os.Open(filepath.Join(dir, savedSysctlsFile))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	var errs []error
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		path, value, ok := strings.Cut(sc.Text(), " ")
		if !ok || strings.Contains(path, "..") {
			continue
		}
		if err := os.WriteFile(filepath.Join(procSys, path), []byte(value+"\n"), 0); err != nil {
			errs = append(errs, fmt.Errorf("restore %s: %w", path, err))
		}
	}
	return true, errors.Join(append(errs, sc.Err())...)
}

// restoreHostNetwork undoes what the agent's host routing left in this
// machine's namespace once the agent is stopped: cilium_host/cilium_net,
// any route it owns (protocol 201), its nftables table (masquerading) and
// the health endpoint (the cilium-health namespace and the lxc_health
// veth, made with host routing) are removed, and the sysctls saved
// by up are written back. It does nothing when up did not turn host
// routing on.
func restoreHostNetwork(dir string, w io.Writer) error {
	restored, err := restoreHostSysctls(dir, "/proc/sys")
	if !restored {
		return err
	}
	names := healthep.Names{}.WithDefaults()
	err = errors.Join(err, devnode.RemoveAgentHostNetwork(context.Background()))
	if err == nil {
		fmt.Fprintf(w, "removed %s, the health endpoint (%s, netns %s), the agent's routes and nftables table %s; restored %s\n",
			routes.HostDevice, names.HostIfName, names.NetnsName, routing.NFTable, strings.Join(hostSysctls, ", "))
	}
	return err
}
