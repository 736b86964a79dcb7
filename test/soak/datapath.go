package soak

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	ebpflink "github.com/cilium/ebpf/link"

	"github.com/cellium/cellium/api/v1/client"
	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/datapath/loader"
	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/datapath/mapsync"
	"github.com/cellium/cellium/statedb/ipcache"
	"github.com/cellium/cellium/statedb/mapstate"
	"github.com/cellium/cellium/statedb/policy"
)

// Datapath is what the agent's pinned eBPF state and the tables it is
// reconciled from hold, read at about the same time.
type Datapath struct {
	// LXC are cellium_lxc's entries by address.
	LXC map[string]LXCEntry
	// LXCTable are the agent's lxc-map table's rows by address.
	LXCTable map[string]LXCEntry
	// IPCache are cellium_ipcache's entries by prefix: the identity.
	IPCache map[string]int64
	// IPCacheTable are the agent's ipcache table's rows by prefix.
	IPCacheTable map[string]IPCacheRow
	// PolicyMaps are the endpoint IDs with a pinned policy map
	// (cellium_policy_<id>).
	PolicyMaps map[int64]bool
	// Links are the pinned program links by endpoint ID (the name of
	// its directory under endpoints/): program name -> the ifindex the
	// tcx link attaches it to (0: the pin is not an attached tcx link).
	Links map[int64]map[string]uint32
	// Policies are the agent's endpoint-policies rows by endpoint ID:
	// the policy computed for each endpoint.
	Policies map[int64]*policy.EndpointPolicyRow
	// PolicyContent is what each pinned policy map holds, by endpoint ID:
	// entry key -> deny.
	PolicyContent map[int64]map[policy.Key]bool
}

// LXCEntry is one endpoint of cellium_lxc or of the lxc-map table.
type LXCEntry struct {
	ID       int64
	Identity int64
	IfIndex  uint32
}

// IPCacheRow is one row of the agent's ipcache table.
type IPCacheRow struct {
	Identity int64
	// Owner is the claim that won ("endpoint 12", "cep ns/name").
	Owner string
}

// datapathProgs are the programs every endpoint has attached to its host
// veth.
var datapathProgs = []string{loader.ProgFromContainer, loader.ProgToContainer}

// readDatapath reads the pinned maps and links under the agent's bpffs
// root and the agent's lxc-map and ipcache tables. The tables are read
// first and the maps after: an entry the reconciler writes meanwhile
// shows up as a disagreement, retried like any other.
func readDatapath(ctx context.Context, agent *client.Client, root string) (*Datapath, error) {
	d := &Datapath{
		LXC: map[string]LXCEntry{}, LXCTable: map[string]LXCEntry{},
		IPCache: map[string]int64{}, IPCacheTable: map[string]IPCacheRow{},
		PolicyMaps: map[int64]bool{}, Links: map[int64]map[string]uint32{},
		Policies: map[int64]*policy.EndpointPolicyRow{}, PolicyContent: map[int64]map[policy.Key]bool{},
	}
	var lxcRows []mapstate.Endpoint
	if err := getTable(ctx, agent, mapstate.EndpointsTableName, &lxcRows); err != nil {
		return nil, err
	}
	for _, r := range lxcRows {
		d.LXCTable[r.IP.String()] = LXCEntry{ID: int64(r.EndpointID), Identity: int64(r.Identity), IfIndex: r.IfIndex}
	}
	var ipcRows []ipcache.Entry
	if err := getTable(ctx, agent, ipcache.TableName, &ipcRows); err != nil {
		return nil, err
	}
	for _, r := range ipcRows {
		d.IPCacheTable[r.Prefix.String()] = IPCacheRow{Identity: int64(r.Identity), Owner: r.Owner}
	}
	var polRows []*policy.EndpointPolicyRow
	if err := getTable(ctx, agent, policy.TableName, &polRows); err != nil {
		return nil, err
	}
	for _, r := range polRows {
		d.Policies[int64(r.EndpointID)] = r
	}

	layout := loader.Layout{Root: root}
	m, err := maps.Open(layout.Dir())
	if err != nil {
		return nil, fmt.Errorf("open the agent's pinned maps: %w", err)
	}
	defer m.Close()
	if err := m.Endpoints.Iterate(func(a netip.Addr, e maps.EndpointInfo) bool {
		d.LXC[a.String()] = LXCEntry{ID: int64(e.ID), Identity: int64(e.Identity), IfIndex: e.IfIndex}
		return true
	}); err != nil {
		return nil, fmt.Errorf("dump %s: %w", maps.EndpointsMapName, err)
	}
	if err := m.IPCache.Iterate(func(p netip.Prefix, e maps.IPCacheEntry) bool {
		d.IPCache[p.String()] = int64(e.Identity)
		return true
	}); err != nil {
		return nil, fmt.Errorf("dump %s: %w", maps.IPCacheMapName, err)
	}

	names, err := listDir(layout.Dir())
	if err != nil {
		return nil, err
	}
	for _, n := range names {
		if rest, ok := strings.CutPrefix(n, maps.PolicyMapName+"_"); ok {
			if id, err := strconv.ParseInt(rest, 10, 64); err == nil {
				d.PolicyMaps[id] = true
				// Gone meanwhile: the map is reported missing or stale.
				if content, err := readPolicyMap(layout.Dir(), uint16(id)); err == nil {
					d.PolicyContent[id] = content
				}
			}
		}
	}
	dirs, err := listDir(layout.EndpointsDir())
	if err != nil {
		return nil, err
	}
	for _, n := range dirs {
		id, err := strconv.ParseInt(n, 10, 64)
		if err != nil {
			continue
		}
		pins, err := listDir(filepath.Join(layout.EndpointsDir(), n))
		if err != nil {
			return nil, err
		}
		d.Links[id] = map[string]uint32{}
		for _, p := range pins {
			d.Links[id][p] = tcxIfindex(filepath.Join(layout.EndpointsDir(), n, p))
		}
	}
	return d, nil
}

// readPolicyMap reads endpoint id's pinned policy map, never creating it.
func readPolicyMap(dir string, id uint16) (map[policy.Key]bool, error) {
	pm, err := maps.LoadPinnedPolicyMap(dir, id)
	if err != nil {
		return nil, err
	}
	defer pm.Close()
	out := map[policy.Key]bool{}
	err = pm.Iterate(func(e policy.Entry) bool {
		out[e.Key] = e.Deny
		return true
	})
	return out, err
}

// getTable reads one of the agent's tables into out; a table the agent
// does not have is an error that names it.
func getTable(ctx context.Context, agent *client.Client, name string, out any) error {
	raw, err := agent.GetStatedbTable(ctx, name)
	if err != nil {
		return fmt.Errorf("agent table %s: %w", name, err)
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("decode agent table %s: %w", name, err)
	}
	return nil
}

// tcxIfindex is the interface the pinned link at path attaches its
// program to, 0 if it is not a tcx link or cannot be read (a pin being
// replaced).
func tcxIfindex(path string) uint32 {
	// Not read-only: the kernel opens pinned links read-write only.
	l, err := ebpflink.LoadPinnedLink(path, nil)
	if err != nil {
		return 0
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		return 0
	}
	if t := info.TCX(); t != nil {
		return t.Ifindex
	}
	return 0
}

// DatapathChecks is how many datapath invariants checkDatapath
// evaluates.
const DatapathChecks = 5

// checkDatapath compares the pinned eBPF state with the agent's tables
// and endpoints:
//
//  1. maps = tables: cellium_lxc holds exactly the lxc-map table's rows,
//     cellium_ipcache exactly the ipcache table's;
//  2. every live pod's endpoint is in cellium_lxc with its ID, identity
//     and host veth, and in cellium_ipcache (its /32) with its identity;
//  3. every live pod's endpoint has its policy map pinned and both
//     programs attached (pinned tcx links) to its host veth;
//  4. nothing is left of deleted endpoints: no cellium_lxc entry for an
//     address no endpoint has, no ipcache row an endpoint or CEP that is
//     gone claimed, no policy map or link directory of an ID no endpoint
//     has;
//  5. every live pod's endpoint has a policy computed for its identity,
//     and its policy map holds exactly that policy's entries (an agent
//     restarted without the API server keeps the previous run's maps
//     until it can compute: at a quiescent point the API server is back,
//     so the policy must be this run's).
func (c *checker) checkDatapath(s *Snapshot, live map[string]Pod) {
	d := s.Datapath
	if d == nil {
		return
	}
	for _, ip := range slices.Sorted(mapKeys(union(d.LXC, d.LXCTable))) {
		got, inMap := d.LXC[ip]
		want, inTable := d.LXCTable[ip]
		switch {
		case !inMap:
			c.addf("bpf-lxc-table", "ip "+ip, "in the lxc-map table (endpoint %d) but not in %s", want.ID, maps.EndpointsMapName)
		case !inTable:
			c.addf("bpf-lxc-table", "ip "+ip, "in %s (endpoint %d) but not in the lxc-map table", maps.EndpointsMapName, got.ID)
		case got != want:
			c.addf("bpf-lxc-table", "ip "+ip, "%s holds %+v, the lxc-map table %+v", maps.EndpointsMapName, got, want)
		}
	}
	for _, p := range slices.Sorted(mapKeys(union(d.IPCache, d.IPCacheTable))) {
		got, inMap := d.IPCache[p]
		want, inTable := d.IPCacheTable[p]
		switch {
		case !inMap:
			c.addf("bpf-ipcache-table", "prefix "+p, "in the ipcache table (identity %d, %s) but not in %s", want.Identity, want.Owner, maps.IPCacheMapName)
		case !inTable:
			c.addf("bpf-ipcache-table", "prefix "+p, "in %s (identity %d) but not in the ipcache table", maps.IPCacheMapName, got)
		case got != want.Identity:
			c.addf("bpf-ipcache-table", "prefix "+p, "%s holds identity %d, the ipcache table %d (%s)", maps.IPCacheMapName, got, want.Identity, want.Owner)
		}
	}

	ids := map[int64]bool{}
	ips := map[string]bool{}
	for _, ep := range s.Endpoints {
		ids[ep.ID] = true
		if ip := endpointIP(&ep); ip != "" {
			ips[ip] = true
		}
		if !isPodEndpoint(&ep) || ep.Spec.K8sNamespace != s.Namespace {
			continue
		}
		p, ok := live[ep.Spec.K8sPodName]
		if !ok || endpointIP(&ep) != p.IP || ep.Status.State != models.EndpointStateReady {
			continue // reported by checkEndpoints
		}
		c.checkEndpointDatapath(d, &ep)
	}
	for _, ip := range slices.Sorted(mapKeys(d.LXC)) {
		if !ips[ip] {
			c.addf("bpf-lxc-stale", "ip "+ip, "%s still delivers to endpoint %d, which no endpoint has that address", maps.EndpointsMapName, d.LXC[ip].ID)
		}
	}
	for _, p := range slices.Sorted(mapKeys(d.IPCacheTable)) {
		row := d.IPCacheTable[p]
		if rest, ok := strings.CutPrefix(row.Owner, "endpoint "); ok {
			if id, err := strconv.ParseInt(rest, 10, 64); err == nil && !ids[id] {
				c.addf("bpf-ipcache-stale", "prefix "+p, "claimed by %s (identity %d), which is gone", row.Owner, row.Identity)
			}
		}
		if rest, ok := strings.CutPrefix(row.Owner, "cep "+s.Namespace+"/"); ok {
			if _, alive := live[rest]; !alive {
				c.addf("bpf-ipcache-stale", "prefix "+p, "claimed by %s (identity %d), whose pod is gone", row.Owner, row.Identity)
			}
		}
	}
	for _, id := range slices.Sorted(mapKeys(d.PolicyMaps)) {
		if !ids[id] {
			c.addf("bpf-policy-map-stale", fmt.Sprintf("endpoint %d", id), "its policy map is still pinned, the endpoint is gone")
		}
	}
	for _, id := range slices.Sorted(mapKeys(d.Links)) {
		if !ids[id] {
			c.addf("bpf-link-stale", fmt.Sprintf("endpoint %d", id), "its program links are still pinned (%v), the endpoint is gone",
				slices.Sorted(mapKeys(d.Links[id])))
		}
	}
}

// checkEndpointDatapath checks one ready endpoint of a live pod.
func (c *checker) checkEndpointDatapath(d *Datapath, ep *models.Endpoint) {
	who := fmt.Sprintf("endpoint %d (pod %s)", ep.ID, ep.Spec.K8sPodName)
	ip := endpointIP(ep)
	idn := endpointIdentity(ep)
	switch e, ok := d.LXC[ip]; {
	case !ok:
		c.addf("bpf-lxc-missing", who, "%s has no entry for %s: packets to it are not delivered", maps.EndpointsMapName, ip)
	case e.ID != ep.ID:
		c.addf("bpf-lxc-id", who, "%s delivers %s to endpoint %d", maps.EndpointsMapName, ip, e.ID)
	case e.Identity != idn:
		c.addf("bpf-lxc-identity", who, "%s says identity %d, the endpoint has %d", maps.EndpointsMapName, e.Identity, idn)
	case ep.Spec.InterfaceIndex != 0 && int(e.IfIndex) != ep.Spec.InterfaceIndex:
		c.addf("bpf-lxc-ifindex", who, "%s says host veth ifindex %d, the endpoint's is %d", maps.EndpointsMapName, e.IfIndex, ep.Spec.InterfaceIndex)
	}
	switch got, ok := d.IPCache[ip+"/32"]; {
	case !ok:
		c.addf("bpf-ipcache-missing", who, "%s has no entry for %s/32", maps.IPCacheMapName, ip)
	case got != idn:
		c.addf("bpf-ipcache-identity", who, "%s says identity %d for %s, the endpoint has %d", maps.IPCacheMapName, got, ip, idn)
	}
	if !d.PolicyMaps[ep.ID] {
		c.addf("bpf-policy-map-missing", who, "no pinned policy map %s_%05d", maps.PolicyMapName, ep.ID)
	} else {
		c.checkPolicyMap(d, ep.ID, idn, who)
	}
	links := d.Links[ep.ID]
	for _, prog := range datapathProgs {
		ifindex, ok := links[prog]
		switch {
		case !ok:
			c.addf("bpf-prog-detached", who, "no pinned link of %s", prog)
		case ifindex == 0:
			c.addf("bpf-prog-detached", who, "the pin of %s is not an attached tcx link", prog)
		case ep.Spec.InterfaceIndex != 0 && int(ifindex) != ep.Spec.InterfaceIndex:
			c.addf("bpf-prog-detached", who, "%s is attached to ifindex %d, the host veth %s is %d", prog, ifindex, ep.Spec.InterfaceName, ep.Spec.InterfaceIndex)
		}
	}
}

// checkPolicyMap checks that endpoint id has a policy computed for its
// identity idn and that its pinned policy map holds exactly its entries.
func (c *checker) checkPolicyMap(d *Datapath, id, idn int64, who string) {
	row, ok := d.Policies[id]
	switch {
	case !ok || row.Policy == nil:
		c.addf("bpf-policy-not-computed", who, "no policy computed for the endpoint (no %s row)", policy.TableName)
		return
	case int64(row.Identity) != idn:
		c.addf("bpf-policy-identity", who, "its policy was computed for identity %d, the endpoint has %d", row.Identity, idn)
		return
	case row.PendingRevision != 0:
		c.addf("bpf-policy-not-computed", who, "its policy waits for a recomputation at revision %d", row.PendingRevision)
		return
	}
	have, ok := d.PolicyContent[id]
	if !ok {
		c.addf("bpf-policy-map-content", who, "its pinned policy map could not be read")
		return
	}
	want := mapsync.Entries(row.Policy)
	var diffs []string
	for _, k := range slices.SortedFunc(mapKeys(want), policy.Key.Compare) {
		deny, in := have[k]
		switch {
		case !in:
			diffs = append(diffs, fmt.Sprintf("missing %s", k))
		case deny != want[k].Deny:
			diffs = append(diffs, fmt.Sprintf("%s deny=%v, want %v", k, deny, want[k].Deny))
		}
	}
	for _, k := range slices.SortedFunc(mapKeys(have), policy.Key.Compare) {
		if _, in := want[k]; !in {
			diffs = append(diffs, fmt.Sprintf("extra %s", k))
		}
	}
	if len(diffs) > 0 {
		if len(diffs) > 4 {
			diffs = append(diffs[:4], fmt.Sprintf("and %d more", len(diffs)-4))
		}
		c.addf("bpf-policy-map-content", who, "its policy map differs from its policy at revision %d (identity %d): %s",
			row.Policy.Revision, row.Identity, strings.Join(diffs, "; "))
	}
}

// union returns a map with the keys of a and b (for listing both).
func union[V1, V2 any](a map[string]V1, b map[string]V2) map[string]bool {
	out := make(map[string]bool, len(a)+len(b))
	for k := range a {
		out[k] = true
	}
	for k := range b {
		out[k] = true
	}
	return out
}

func mapKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}
