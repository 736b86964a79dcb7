package devkubelet

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/vishvananda/netlink"

	"github.com/cellium/cellium/datapath/link"
)

// RemoveLeftovers removes, without calling any plugin, what the sandboxes
// recorded in stateDir (a kubelet's Config.StateDir) left on this machine:
// their network namespaces and the host side of their veths. It is for
// when the agent is gone too (devcluster down after a crash); addresses
// and endpoints held by an agent are not released. It returns what it
// removed ("netns NAME", "link NAME").
func RemoveLeftovers(stateDir string) ([]string, error) {
	store := sandboxStore{dir: filepath.Join(stateDir, "sandboxes")}
	records, err := store.load()
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, sb := range records {
		names := append(slices.Clone(sb.HostInterfaces), link.HostInterfaceName(sb.ID, sb.IfName))
		for _, name := range slices.Compact(slices.Sorted(slices.Values(names))) {
			l, err := netlink.LinkByName(name)
			if err != nil {
				continue // gone
			}
			if l.Type() != "veth" {
				continue // not ours
			}
			if err := netlink.LinkDel(l); err != nil {
				errs = append(errs, fmt.Errorf("delete link %s: %w", name, err))
				continue
			}
			removed = append(removed, "link "+name)
		}
		if _, err := os.Lstat(sb.NetnsPath); err == nil {
			if err := removeNetns(sb.NetnsPath); err != nil {
				errs = append(errs, err)
				continue
			}
			removed = append(removed, "netns "+sb.NetnsName())
		}
		errs = append(errs, store.remove(sb.ID))
	}
	return removed, errors.Join(errs...)
}
