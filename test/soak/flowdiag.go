package soak

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/cellium/cellium/datapath/loader"
	dpmaps "github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/statedb/policy"
)

// flowEnds are the pinned connection's two ends as the datapath sees
// them: the client's address and port, the server's.
type flowEnds struct {
	cli, srv netip.AddrPort
}

// readMetrics reads the agent's pinned metrics map (forwarded and
// dropped packets by reason and direction); nil when the soak runs
// without the datapath or the map cannot be read.
func (s *Soak) readMetrics() map[dpmaps.MetricsKey]dpmaps.MetricsValue {
	if s.src.bpfRoot == "" {
		return nil
	}
	m, err := dpmaps.Open(loader.Layout{Root: s.src.bpfRoot}.Dir())
	if err != nil {
		return nil
	}
	defer m.Close()
	all, err := m.Metrics.Read()
	if err != nil {
		return nil
	}
	return all
}

// flowDiagnosis says what the datapath holds about the pinned connection
// after an exchange on it failed, so that a broken connection in a run
// that cannot be repeated still says why: the drops counted since the
// last exchange that worked (by reason and direction), the conntrack
// entries of its tuple, both ends' ipcache and endpoint map entries, and
// what the server's policy map says of the client's identity.
func (s *Soak) flowDiagnosis(ends flowEnds, before map[dpmaps.MetricsKey]dpmaps.MetricsValue) string {
	if s.src.bpfRoot == "" {
		return "no datapath"
	}
	dir := loader.Layout{Root: s.src.bpfRoot}.Dir()
	m, err := dpmaps.Open(dir)
	if err != nil {
		return fmt.Sprintf("open the agent's pinned maps: %v", err)
	}
	defer m.Close()
	var out []string
	add := func(format string, a ...any) { out = append(out, fmt.Sprintf(format, a...)) }

	if after, err := m.Metrics.Read(); err != nil {
		add("metrics: %v", err)
	} else {
		var drops []string
		for _, k := range slices.SortedFunc(maps.Keys(after), func(a, b dpmaps.MetricsKey) int {
			return int(a.Reason)*4 + int(a.Dir) - int(b.Reason)*4 - int(b.Dir)
		}) {
			if k.Reason == dpmaps.ReasonForwarded {
				continue
			}
			if n := after[k].Packets - before[k].Packets; n > 0 {
				drops = append(drops, fmt.Sprintf("%s %s: %d", k.Dir, dpmaps.DropReasonName(k.Reason), n))
			}
		}
		if len(drops) == 0 {
			drops = []string{"none"}
		}
		add("drops since the last good exchange (all endpoints): %s", strings.Join(drops, ", "))
	}

	var cts []string
	err = m.CT4.Iterate(func(k dpmaps.CTKey, e dpmaps.CTEntry) bool {
		fwd := k.Src == ends.cli.Addr() && k.SrcPort == ends.cli.Port() && k.Dst == ends.srv.Addr() && k.DstPort == ends.srv.Port()
		if fwd {
			cts = append(cts, fmt.Sprintf("{endpoint %d %s remote %d flags %#x tx %d rx %d}", k.Endpoint, k.Dir, e.RemoteID, e.Flags, e.TxPackets, e.RxPackets))
		}
		return true
	})
	if err != nil {
		add("conntrack: %v", err)
	} else {
		if len(cts) == 0 {
			cts = []string{"none"}
		}
		add("conntrack entries of %s -> %s: %s", ends.cli, ends.srv, strings.Join(cts, " "))
	}

	var srvEP uint16
	for _, e := range []struct {
		name string
		a    netip.Addr
	}{{pinnedClient, ends.cli.Addr()}, {pinnedServer, ends.srv.Addr()}} {
		ipc, ierr := m.IPCache.Lookup(netip.PrefixFrom(e.a, 32))
		lxc, lerr := m.Endpoints.Lookup(e.a)
		desc := fmt.Sprintf("%s %s: ipcache ", e.name, e.a)
		if ierr != nil {
			desc += "missing"
		} else {
			desc += fmt.Sprintf("identity %d", ipc.Identity)
		}
		if lerr != nil {
			desc += ", endpoint map missing"
		} else {
			desc += fmt.Sprintf(", endpoint map ID %d identity %d ifindex %d", lxc.ID, lxc.Identity, lxc.IfIndex)
			if e.name == pinnedServer {
				srvEP = lxc.ID
			}
		}
		add("%s", desc)
	}

	if srvEP != 0 {
		if cli, err := m.Endpoints.Lookup(ends.cli.Addr()); err == nil {
			pm, perr := dpmaps.LoadPinnedPolicyMap(dir, srvEP)
			if perr != nil {
				add("%s's policy map: %v", pinnedServer, perr)
			} else {
				v, lerr := pm.Lookup(policy.NewKey(cli.Identity, policy.Ingress, 6, ends.srv.Port(), 16))
				if lerr != nil {
					add("%s's policy map has no ingress entry for identity %d tcp/%d", pinnedServer, cli.Identity, ends.srv.Port())
				} else {
					add("%s's policy map: ingress from identity %d tcp/%d deny=%v", pinnedServer, cli.Identity, ends.srv.Port(), v.Deny)
				}
				pm.Close()
			}
		}
	}
	return strings.Join(out, "; ")
}
