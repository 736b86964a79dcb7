// Package lb defines the socket load balancer's tables: frontends
// (a Service's ClusterIP, port and protocol, with the backends it
// balances to; with kube-proxy replacement also its NodePort,
// LoadBalancer and externalIP frontends and the pods' hostPorts) and
// backends (an address, port and protocol with the numeric ID the BPF
// maps refer to it by), each row with its reconciliation status, and the
// pure derivation of a Service's frontends from the Service and its
// EndpointSlices (DeriveFrontends) and of a pod's (PodHostPortFrontends). datapath/lbsync derives the
// tables from the Kubernetes tables and reconciles them into the BPF maps
// of bpf/sock.c.
package lb

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"

	"github.com/cellium/cellium/statedb/reconciler"
)

// Table names (`cellium statedb <name>`).
const (
	FrontendsTableName = "lb-frontends"
	BackendsTableName  = "lb-backends"
)

// Protocols of an L4Addr: the IP protocol numbers.
const (
	TCP uint8 = 6
	UDP uint8 = 17
)

// L4Addr is an IPv4 address, a port and an IP protocol (TCP or UDP).
type L4Addr struct {
	Addr  netip.Addr `json:"addr"`
	Port  uint16     `json:"port"`
	Proto uint8      `json:"proto"`
}

// ProtoName returns "TCP", "UDP" or the protocol number.
func ProtoName(p uint8) string {
	switch p {
	case TCP:
		return "TCP"
	case UDP:
		return "UDP"
	}
	return strconv.Itoa(int(p))
}

// String is "10.96.0.10:53/UDP".
func (a L4Addr) String() string {
	return netip.AddrPortFrom(a.Addr, a.Port).String() + "/" + ProtoName(a.Proto)
}

// Compare orders by address, port, protocol.
func (a L4Addr) Compare(b L4Addr) int {
	if c := a.Addr.Compare(b.Addr); c != 0 {
		return c
	}
	if c := cmp.Compare(a.Port, b.Port); c != 0 {
		return c
	}
	return cmp.Compare(a.Proto, b.Proto)
}

// key is the index key: 4 address bytes, 2 port bytes, the protocol.
func (a L4Addr) key() index.Key {
	b := a.Addr.As4()
	return index.Key(append(b[:], byte(a.Port>>8), byte(a.Port), a.Proto))
}

// ParseL4Addr parses "10.96.0.10:53/UDP" (String's form).
func ParseL4Addr(s string) (L4Addr, error) {
	ap, proto, ok := strings.Cut(s, "/")
	if !ok {
		return L4Addr{}, fmt.Errorf("%q: want address:port/protocol", s)
	}
	a, err := netip.ParseAddrPort(ap)
	if err != nil {
		return L4Addr{}, fmt.Errorf("%q: %w", s, err)
	}
	out := L4Addr{Addr: a.Addr(), Port: a.Port()}
	switch strings.ToUpper(proto) {
	case "TCP":
		out.Proto = TCP
	case "UDP":
		out.Proto = UDP
	default:
		return L4Addr{}, fmt.Errorf("%q: protocol %q is not TCP or UDP", s, proto)
	}
	if !out.Addr.Is4() {
		return L4Addr{}, fmt.Errorf("%q: not an IPv4 address", s)
	}
	return out, nil
}

// SocketLB says whether the socket load balancer is on (--bpf-lb-sock):
// then it translates every frontend of the frontends table at connect()
// and sendmsg(), and a packet a pod sends to a frontend's address
// untranslated has escaped its hooks. The cell that owns the tables
// (daemon/socklb) provides it; a cell reading it takes it as optional,
// the zero value (off) standing for an agent without the BPF datapath.
type SocketLB struct {
	// Enabled is --bpf-lb-sock under --enable-bpf-datapath.
	Enabled bool
}

// KubeProxyReplacement says whether the agent replaces kube-proxy
// (--kube-proxy-replacement): then the frontends table also holds every
// Service's NodePort, LoadBalancer and externalIP frontends with traffic
// policies applied, for the socket load balancer and for the programs on
// the node's uplinks. The cell that owns the tables (daemon/socklb)
// provides it; the zero value is off.
type KubeProxyReplacement struct {
	// Enabled is --kube-proxy-replacement=true.
	Enabled bool
}

// Frontend types (Frontend.Type): how the Service exposes the address.
const (
	TypeClusterIP    = "ClusterIP"
	TypeNodePort     = "NodePort"     // a node address (or 0.0.0.0, the node's loopback) and the nodePort
	TypeLoadBalancer = "LoadBalancer" // status.loadBalancer.ingress[].ip and the port
	TypeExternalIP   = "ExternalIPs"  // spec.externalIPs and the port (Cilium's name)
	TypeHostPort     = "HostPort"     // a pod's hostPort (not derived yet)
)

// Scope names of a frontend's two entries (Frontend.TwoScopes).
const (
	ScopeExternal = "external"
	ScopeInternal = "internal"
)

// Frontend is one address:port/protocol of a Service (its ClusterIP, or
// with --kube-proxy-replacement a NodePort, LoadBalancer or externalIP
// frontend) and the backends connections to it go to. Rows are
// immutable: copy, then insert.
type Frontend struct {
	// Address is the frontend's address, port and protocol: the
	// ClusterIP and the Service port, or a node address and the
	// nodePort, ...
	Address L4Addr `json:"address"`
	// Type is one of TypeClusterIP, TypeNodePort, TypeLoadBalancer,
	// TypeExternalIP ("" is a ClusterIP).
	Type string `json:"type,omitempty"`
	// Service is the Service's "namespace/name", PortName its port's name.
	Service  string `json:"service"`
	PortName string `json:"port-name,omitempty"`
	// Backends are the ready endpoints' addresses with the target port,
	// sorted; none means connections fail (EHOSTUNREACH).
	Backends []L4Addr `json:"backends"`
	// BackendIDs are the IDs of Backends (same order) in the backends
	// table, as the services map refers to them.
	BackendIDs []uint32 `json:"backend-ids"`
	// SessionAffinity is the Service's sessionAffinity: ClientIP. The
	// programs send a client (a network namespace) to the backend they
	// sent it to last time, unless that was more than AffinityTimeout
	// seconds ago or the backend is gone.
	SessionAffinity bool   `json:"session-affinity,omitempty"`
	AffinityTimeout uint32 `json:"affinity-timeout,omitempty"`
	// Local is externalTrafficPolicy Local on a NodePort, LoadBalancer or
	// externalIP frontend: Backends are this node's only, and the
	// client's address is kept.
	Local bool `json:"local,omitempty"`
	// TwoScopes says that clients inside the cluster (sockets, pods) get
	// IntBackends instead of Backends: the Service's internal and
	// external traffic policies differ. Backends are then the external
	// scope's.
	TwoScopes     bool     `json:"two-scopes,omitempty"`
	IntBackends   []L4Addr `json:"int-backends,omitempty"`
	IntBackendIDs []uint32 `json:"int-backend-ids,omitempty"`
	// SourceRanges are the Service's loadBalancerSourceRanges (IPv4,
	// masked, sorted) on a frontend they apply to (DeriveFrontends):
	// clients from outside the node not in one of them are dropped. Empty
	// means no restriction.
	SourceRanges []netip.Prefix `json:"source-ranges,omitempty"`
	// Status is the reconciliation status of the services map entries.
	Status reconciler.Status `json:"status"`
}

// SameAs reports whether f and o differ at most in Status.
func (f *Frontend) SameAs(o *Frontend) bool {
	return f.Address == o.Address && f.Service == o.Service && f.PortName == o.PortName &&
		f.SessionAffinity == o.SessionAffinity && f.AffinityTimeout == o.AffinityTimeout &&
		slices.Equal(f.Backends, o.Backends) && slices.Equal(f.BackendIDs, o.BackendIDs) &&
		f.Type == o.Type && f.Local == o.Local && f.TwoScopes == o.TwoScopes &&
		slices.Equal(f.IntBackends, o.IntBackends) && slices.Equal(f.IntBackendIDs, o.IntBackendIDs) &&
		slices.Equal(f.SourceRanges, o.SourceRanges)
}

// TypeName is Type, "ClusterIP" when empty.
func (f *Frontend) TypeName() string {
	if f.Type == "" {
		return TypeClusterIP
	}
	return f.Type
}

// NodePort reports whether outside clients reach the frontend through
// the node (LB4_SVC_NODEPORT): a NodePort, LoadBalancer or externalIP
// frontend.
func (f *Frontend) NodePort() bool {
	switch f.Type {
	case TypeNodePort, TypeLoadBalancer, TypeExternalIP, TypeHostPort:
		return true
	}
	return false
}

// AllBackends returns Backends followed by IntBackends, and their IDs:
// every backend the frontend references.
func (f *Frontend) AllBackends() ([]L4Addr, []uint32) {
	return slices.Concat(f.Backends, f.IntBackends), slices.Concat(f.BackendIDs, f.IntBackendIDs)
}

// FlagsString is "local,two-scopes,source-ranges=10.0.0.0/8+192.0.2.0/24"
// for the flags beside session affinity, "-" for none.
func (f *Frontend) FlagsString() string {
	var fs []string
	if f.Local {
		fs = append(fs, "local")
	}
	if f.TwoScopes {
		fs = append(fs, "two-scopes")
	}
	if len(f.SourceRanges) > 0 {
		rs := make([]string, len(f.SourceRanges))
		for i, r := range f.SourceRanges {
			rs[i] = r.String()
		}
		fs = append(fs, "source-ranges="+strings.Join(rs, "+"))
	}
	if len(fs) == 0 {
		return "-"
	}
	return strings.Join(fs, ",")
}

// WithStatus returns a copy of f with status s.
func (f *Frontend) WithStatus(s reconciler.Status) *Frontend {
	c := *f
	c.Status = s
	return &c
}

// TableHeader implements statedb.TableWritable.
func (*Frontend) TableHeader() []string {
	return []string{"Address", "Service", "Affinity", "Backends", "Type", "Flags", "IntBackends", "Status"}
}

// AffinityString is "ClientIP 10800s" with session affinity, else "None"
// (the Service's sessionAffinity).
func (f *Frontend) AffinityString() string {
	if !f.SessionAffinity {
		return "None"
	}
	return fmt.Sprintf("ClientIP %ds", f.AffinityTimeout)
}

// TableRow implements statedb.TableWritable.
func (f *Frontend) TableRow() []string {
	svc := f.Service
	if f.PortName != "" {
		svc += ":" + f.PortName
	}
	ints := "-"
	if f.TwoScopes {
		ints = backendsString(f.IntBackends, f.IntBackendIDs)
	}
	return []string{f.Address.String(), svc, f.AffinityString(), backendsString(f.Backends, f.BackendIDs),
		f.TypeName(), f.FlagsString(), ints, f.Status.String()}
}

// backendsString is "10.0.1.20:8080#3, 10.0.2.21:8080#4".
func backendsString(bs []L4Addr, ids []uint32) string {
	out := make([]string, len(bs))
	for i, b := range bs {
		id := uint32(0)
		if i < len(ids) {
			id = ids[i]
		}
		out[i] = fmt.Sprintf("%s#%d", netip.AddrPortFrom(b.Addr, b.Port), id)
	}
	return strings.Join(out, ", ")
}

// l4AddrKey is the index key of an L4Addr in its text form.
func l4AddrKey(s string) (index.Key, error) {
	a, err := ParseL4Addr(s)
	if err != nil {
		return nil, err
	}
	return a.key(), nil
}

// FrontendAddressIndex is the frontends table's primary index.
var FrontendAddressIndex = statedb.Index[*Frontend, L4Addr]{
	Name:       "address",
	FromObject: func(f *Frontend) index.KeySet { return index.NewKeySet(f.Address.key()) },
	FromKey:    L4Addr.key,
	FromString: l4AddrKey,
	Unique:     true,
}

// FrontendServiceIndex indexes frontends by Service ("namespace/name").
var FrontendServiceIndex = statedb.Index[*Frontend, string]{
	Name:       "service",
	FromObject: func(f *Frontend) index.KeySet { return index.NewKeySet(index.String(f.Service)) },
	FromKey:    index.String,
	FromString: index.FromString,
}

// NewFrontendsTable creates and registers the frontends table.
func NewFrontendsTable(db *statedb.DB) (statedb.RWTable[*Frontend], error) {
	t, err := statedb.NewTable(db, FrontendsTableName, FrontendAddressIndex, FrontendServiceIndex)
	if err != nil {
		return nil, fmt.Errorf("create table %s: %w", FrontendsTableName, err)
	}
	return t, nil
}

// Backend is one backend address and the ID the services map refers to
// it by. A row exists while a frontend has it. Rows are immutable.
type Backend struct {
	Address L4Addr `json:"address"`
	// ID is the key in the backends map (1..65535).
	ID uint32 `json:"id"`
	// Status is the reconciliation status of the backends map entry.
	Status reconciler.Status `json:"status"`
}

// SameAs reports whether b and o differ at most in Status.
func (b *Backend) SameAs(o *Backend) bool { return b.Address == o.Address && b.ID == o.ID }

// WithStatus returns a copy of b with status s.
func (b *Backend) WithStatus(s reconciler.Status) *Backend {
	c := *b
	c.Status = s
	return &c
}

// TableHeader implements statedb.TableWritable.
func (*Backend) TableHeader() []string { return []string{"ID", "Address", "Status"} }

// TableRow implements statedb.TableWritable.
func (b *Backend) TableRow() []string {
	return []string{strconv.FormatUint(uint64(b.ID), 10), b.Address.String(), b.Status.String()}
}

// BackendAddressIndex is the backends table's primary index.
var BackendAddressIndex = statedb.Index[*Backend, L4Addr]{
	Name:       "address",
	FromObject: func(b *Backend) index.KeySet { return index.NewKeySet(b.Address.key()) },
	FromKey:    L4Addr.key,
	FromString: l4AddrKey,
	Unique:     true,
}

// BackendIDIndex indexes backends by ID.
var BackendIDIndex = statedb.Index[*Backend, uint32]{
	Name:       "id",
	FromObject: func(b *Backend) index.KeySet { return index.NewKeySet(index.Uint32(b.ID)) },
	FromKey:    index.Uint32,
	FromString: index.Uint32String,
	Unique:     true,
}

// NewBackendsTable creates and registers the backends table.
func NewBackendsTable(db *statedb.DB) (statedb.RWTable[*Backend], error) {
	t, err := statedb.NewTable(db, BackendsTableName, BackendAddressIndex, BackendIDIndex)
	if err != nil {
		return nil, fmt.Errorf("create table %s: %w", BackendsTableName, err)
	}
	return t, nil
}
