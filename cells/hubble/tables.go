package hubble

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/hubble/parser"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/ipcache"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/labels"
	"github.com/cellium/cellium/statedb/lb"
	"github.com/cellium/cellium/statedb/nodes"
	"github.com/cellium/cellium/statedb/policy"
)

// Tables are the agent's tables flows are enriched from. A nil table
// leaves out what it would give.
type Tables struct {
	DB         *statedb.DB
	Endpoints  statedb.Table[*endpoints.Endpoint]
	Pods       statedb.Table[*corev1.Pod]
	IPCache    statedb.Table[*ipcache.Entry]
	Nodes      statedb.Table[*nodes.Node]
	Identities statedb.Table[*ciliumv2.CiliumIdentity]
	Frontends  statedb.Table[*lb.Frontend]
	Policies   statedb.Table[*policy.EndpointPolicyRow]
	// K8sNodes gives the node labels (Flow.node_labels).
	K8sNodes statedb.Table[*corev1.Node]
}

// maxCache bounds each cache: a full cache starts over.
const maxCache = 16384

// revCache caches what was looked up or derived from one table, keyed
// by the lookup, valid while the table's revision stays the same: any
// change of the table empties it. Most flows repeat a few addresses and
// identities, and tables change far less often than packets flow.
type revCache[K comparable, V any] struct {
	mu  sync.Mutex
	rev uint64
	m   map[K]V
}

func (c *revCache[K, V]) get(rev uint64, k K, load func() V) V {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m != nil && c.rev == rev {
		if v, ok := c.m[k]; ok {
			return v
		}
	}
	v := load()
	if c.m == nil || c.rev != rev || len(c.m) >= maxCache {
		c.m, c.rev = make(map[K]V), rev
	}
	c.m[k] = v
	return v
}

// found is a lookup's result with whether there was one.
type found[V any] struct {
	v  V
	ok bool
}

// tableSources implements the parser's Sources over Tables.
type tableSources struct {
	t Tables

	endpoints  revCache[netip.Addr, found[*endpoints.Endpoint]]
	workloads  revCache[[2]string, []*flowpb.Workload]
	ipcache    revCache[netip.Addr, found[*ipcache.Entry]]
	nodes      revCache[netip.Addr, found[string]]
	identities revCache[identity.NumericIdentity, found[[]string]]
	services   revCache[lb.L4Addr, found[*flowpb.Service]]
	policies   revCache[uint16, found[*policy.EndpointPolicy]]
	nodeLabels revCache[string, []string]

	// The prefix lengths the ipcache has, longest first, at lensRev;
	// used under ipcache's lock only.
	lensRev uint64
	lens    []int
}

// NewSources returns the parser's sources reading the tables t.
func NewSources(t Tables) parser.Sources {
	s := &tableSources{t: t}
	var src parser.Sources
	if t.Endpoints != nil {
		src.Endpoints = s
	}
	if t.Pods != nil {
		src.Workloads = s
	}
	if t.IPCache != nil {
		src.IPCache = s
	}
	if t.Nodes != nil {
		src.Nodes = s
	}
	if t.Identities != nil {
		src.Identities = s
	}
	if t.Frontends != nil {
		src.Services = s
	}
	if t.Policies != nil {
		src.Policies = s
	}
	if t.K8sNodes != nil {
		src.NodeLabels = s
	}
	return src
}

func (s *tableSources) EndpointByIP(ip netip.Addr) (*endpoints.Endpoint, bool) {
	txn := s.t.DB.ReadTxn()
	r := s.endpoints.get(s.t.Endpoints.Revision(txn), ip, func() found[*endpoints.Endpoint] {
		ep, _, ok := s.t.Endpoints.Get(txn, endpoints.IPIndex.Query(ip))
		return found[*endpoints.Endpoint]{ep, ok}
	})
	return r.v, r.ok
}

func (s *tableSources) PodWorkloads(namespace, name string) []*flowpb.Workload {
	txn := s.t.DB.ReadTxn()
	return s.workloads.get(s.t.Pods.Revision(txn), [2]string{namespace, name}, func() []*flowpb.Workload {
		pod, _, ok := s.t.Pods.Get(txn, k8stables.NameIndex[*corev1.Pod]().Query(namespace+"/"+name))
		if !ok {
			return nil
		}
		if w := parser.WorkloadOf(pod); w != nil {
			return []*flowpb.Workload{w}
		}
		return nil
	})
}

// LookupIP finds the longest prefix holding ip by looking each prefix
// length the table has up, longest first (a miss is world).
func (s *tableSources) LookupIP(ip netip.Addr) (*ipcache.Entry, bool) {
	txn := s.t.DB.ReadTxn()
	rev := s.t.IPCache.Revision(txn)
	r := s.ipcache.get(rev, ip, func() found[*ipcache.Entry] {
		for _, bits := range s.prefixLengths(txn, rev) {
			if bits > ip.BitLen() {
				continue
			}
			p, err := ip.Prefix(bits)
			if err != nil {
				continue
			}
			if e, _, ok := s.t.IPCache.Get(txn, ipcache.PrefixIndex.Query(p)); ok {
				return found[*ipcache.Entry]{e, true}
			}
		}
		return found[*ipcache.Entry]{}
	})
	return r.v, r.ok
}

// prefixLengths returns the prefix lengths of the ipcache's rows, longest
// first, recomputed when the table changed (called under the ipcache
// cache's lock).
func (s *tableSources) prefixLengths(txn statedb.ReadTxn, rev uint64) []int {
	if s.lens != nil && s.lensRev == rev {
		return s.lens
	}
	var seen [129]bool
	for e := range s.t.IPCache.All(txn) {
		seen[e.Prefix.Bits()] = true
	}
	lens := make([]int, 0, 8)
	for b := 128; b >= 0; b-- {
		if seen[b] {
			lens = append(lens, b)
		}
	}
	s.lens, s.lensRev = lens, rev
	return lens
}

func (s *tableSources) NodeNameByIP(ip netip.Addr) (string, bool) {
	txn := s.t.DB.ReadTxn()
	r := s.nodes.get(s.t.Nodes.Revision(txn), ip, func() found[string] {
		n, _, ok := s.t.Nodes.Get(txn, nodes.NodeInternalIPIndex.Query(ip.Unmap()))
		if !ok {
			return found[string]{}
		}
		return found[string]{n.Name, true}
	})
	return r.v, r.ok
}

func (s *tableSources) IdentityLabels(id identity.NumericIdentity) ([]string, bool) {
	txn := s.t.DB.ReadTxn()
	r := s.identities.get(s.t.Identities.Revision(txn), id, func() found[[]string] {
		obj, _, ok := s.t.Identities.Get(txn, k8stables.NameIndex[*ciliumv2.CiliumIdentity]().Query(strconv.FormatUint(uint64(id), 10)))
		if !ok {
			return found[[]string]{}
		}
		return found[[]string]{parser.SortedLabels(labels.FromMap(obj.SecurityLabels, "")), true}
	})
	return r.v, r.ok
}

func (s *tableSources) ServiceByFrontend(addr lb.L4Addr) (*flowpb.Service, bool) {
	txn := s.t.DB.ReadTxn()
	r := s.services.get(s.t.Frontends.Revision(txn), addr, func() found[*flowpb.Service] {
		fe, _, ok := s.t.Frontends.Get(txn, lb.FrontendAddressIndex.Query(addr))
		if !ok {
			return found[*flowpb.Service]{}
		}
		ns, name, cut := strings.Cut(fe.Service, "/")
		if !cut {
			return found[*flowpb.Service]{&flowpb.Service{Name: fe.Service}, true}
		}
		return found[*flowpb.Service]{&flowpb.Service{Namespace: ns, Name: name}, true}
	})
	return r.v, r.ok
}

func (s *tableSources) EndpointPolicy(id uint16) (*policy.EndpointPolicy, bool) {
	txn := s.t.DB.ReadTxn()
	r := s.policies.get(s.t.Policies.Revision(txn), id, func() found[*policy.EndpointPolicy] {
		row, _, ok := s.t.Policies.Get(txn, policy.EndpointIDIndex.Query(id))
		if !ok || row.Policy == nil {
			return found[*policy.EndpointPolicy]{}
		}
		return found[*policy.EndpointPolicy]{row.Policy, true}
	})
	return r.v, r.ok
}

func (s *tableSources) NodeLabels(name string) []string {
	txn := s.t.DB.ReadTxn()
	return s.nodeLabels.get(s.t.K8sNodes.Revision(txn), name, func() []string {
		n, _, ok := s.t.K8sNodes.Get(txn, k8stables.NameIndex[*corev1.Node]().Query(name))
		if !ok || len(n.Labels) == 0 {
			return nil
		}
		out := make([]string, 0, len(n.Labels))
		for k, v := range n.Labels {
			out = append(out, k+"="+v)
		}
		slices.Sort(out)
		return out
	})
}
