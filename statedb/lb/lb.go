// Package lb defines the socket load balancer's tables: frontends
// (a Service's ClusterIP, port and protocol, with the backends it
// balances to) and backends (an address, port and protocol with the
// numeric ID the BPF maps refer to it by), each row with its
// reconciliation status, and the pure derivation of a Service's frontends
// from the Service and its EndpointSlices. datapath/lbsync derives the
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

// Frontend is one ClusterIP:port/protocol of a Service and the backends
// connections to it go to. Rows are immutable: copy, then insert.
type Frontend struct {
	// Address is the ClusterIP, the Service port and its protocol.
	Address L4Addr `json:"address"`
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
	// Status is the reconciliation status of the services map entries.
	Status reconciler.Status `json:"status"`
}

// SameAs reports whether f and o differ at most in Status.
func (f *Frontend) SameAs(o *Frontend) bool {
	return f.Address == o.Address && f.Service == o.Service && f.PortName == o.PortName &&
		f.SessionAffinity == o.SessionAffinity && f.AffinityTimeout == o.AffinityTimeout &&
		slices.Equal(f.Backends, o.Backends) && slices.Equal(f.BackendIDs, o.BackendIDs)
}

// WithStatus returns a copy of f with status s.
func (f *Frontend) WithStatus(s reconciler.Status) *Frontend {
	c := *f
	c.Status = s
	return &c
}

// TableHeader implements statedb.TableWritable.
func (*Frontend) TableHeader() []string {
	return []string{"Address", "Service", "Affinity", "Backends", "Status"}
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
	bs := make([]string, len(f.Backends))
	for i, b := range f.Backends {
		bs[i] = fmt.Sprintf("%s#%d", netip.AddrPortFrom(b.Addr, b.Port), f.id(i))
	}
	svc := f.Service
	if f.PortName != "" {
		svc += ":" + f.PortName
	}
	return []string{f.Address.String(), svc, f.AffinityString(), strings.Join(bs, ", "), f.Status.String()}
}

func (f *Frontend) id(i int) uint32 {
	if i < len(f.BackendIDs) {
		return f.BackendIDs[i]
	}
	return 0
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
