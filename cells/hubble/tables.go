package hubble

import (
	"net/netip"
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
}

// maxMemo bounds each cache of derived values: a full cache starts over.
const maxMemo = 16384

// memo caches a value derived from an immutable table row, keyed by the
// row's pointer (a changed object is a new row).
type memo[K comparable, V any] struct {
	mu sync.Mutex
	m  map[K]V
}

func (c *memo[K, V]) get(k K, derive func() V) V {
	c.mu.Lock()
	defer c.mu.Unlock()
	if v, ok := c.m[k]; ok {
		return v
	}
	v := derive()
	if c.m == nil || len(c.m) >= maxMemo {
		c.m = make(map[K]V)
	}
	c.m[k] = v
	return v
}

// tableSources implements the parser's Sources over Tables.
type tableSources struct {
	t Tables

	workloads  memo[*corev1.Pod, []*flowpb.Workload]
	identities memo[*ciliumv2.CiliumIdentity, []string]
	services   memo[*lb.Frontend, *flowpb.Service]

	// prefix lengths present in the ipcache, at ipcRev
	ipcMu   sync.Mutex
	ipcRev  uint64
	ipcLens []int
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
	return src
}

func (s *tableSources) EndpointByIP(ip netip.Addr) (*endpoints.Endpoint, bool) {
	ep, _, ok := s.t.Endpoints.Get(s.t.DB.ReadTxn(), endpoints.IPIndex.Query(ip))
	return ep, ok
}

func (s *tableSources) PodWorkloads(namespace, name string) []*flowpb.Workload {
	pod, _, ok := s.t.Pods.Get(s.t.DB.ReadTxn(), k8stables.NameIndex[*corev1.Pod]().Query(namespace+"/"+name))
	if !ok {
		return nil
	}
	return s.workloads.get(pod, func() []*flowpb.Workload {
		if w := parser.WorkloadOf(pod); w != nil {
			return []*flowpb.Workload{w}
		}
		return nil
	})
}

// LookupIP finds the longest prefix holding ip by looking each prefix
// length the table has up, longest first.
func (s *tableSources) LookupIP(ip netip.Addr) (*ipcache.Entry, bool) {
	txn := s.t.DB.ReadTxn()
	for _, bits := range s.prefixLengths(txn, ip.BitLen()) {
		p, err := ip.Prefix(bits)
		if err != nil {
			continue
		}
		if e, _, ok := s.t.IPCache.Get(txn, ipcache.PrefixIndex.Query(p)); ok {
			return e, true
		}
	}
	return nil, false
}

// prefixLengths returns the prefix lengths of the ipcache's rows up to
// maxBits, longest first, recomputed when the table changed.
func (s *tableSources) prefixLengths(txn statedb.ReadTxn, maxBits int) []int {
	rev := s.t.IPCache.Revision(txn)
	s.ipcMu.Lock()
	defer s.ipcMu.Unlock()
	if rev != s.ipcRev || s.ipcLens == nil {
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
		s.ipcRev, s.ipcLens = rev, lens
	}
	lens := s.ipcLens
	for len(lens) > 0 && lens[0] > maxBits {
		lens = lens[1:]
	}
	return lens
}

func (s *tableSources) NodeNameByIP(ip netip.Addr) (string, bool) {
	n, _, ok := s.t.Nodes.Get(s.t.DB.ReadTxn(), nodes.NodeInternalIPIndex.Query(ip.Unmap()))
	if !ok {
		return "", false
	}
	return n.Name, true
}

func (s *tableSources) IdentityLabels(id identity.NumericIdentity) ([]string, bool) {
	obj, _, ok := s.t.Identities.Get(s.t.DB.ReadTxn(), k8stables.NameIndex[*ciliumv2.CiliumIdentity]().Query(strconv.FormatUint(uint64(id), 10)))
	if !ok {
		return nil, false
	}
	return s.identities.get(obj, func() []string {
		return parser.SortedLabels(labels.FromMap(obj.SecurityLabels, ""))
	}), true
}

func (s *tableSources) ServiceByFrontend(addr lb.L4Addr) (*flowpb.Service, bool) {
	fe, _, ok := s.t.Frontends.Get(s.t.DB.ReadTxn(), lb.FrontendAddressIndex.Query(addr))
	if !ok {
		return nil, false
	}
	return s.services.get(fe, func() *flowpb.Service {
		ns, name, found := strings.Cut(fe.Service, "/")
		if !found {
			return &flowpb.Service{Name: fe.Service}
		}
		return &flowpb.Service{Namespace: ns, Name: name}
	}), true
}

func (s *tableSources) EndpointPolicy(id uint16) (*policy.EndpointPolicy, bool) {
	row, _, ok := s.t.Policies.Get(s.t.DB.ReadTxn(), policy.EndpointIDIndex.Query(id))
	if !ok || row.Policy == nil {
		return nil, false
	}
	return row.Policy, true
}
