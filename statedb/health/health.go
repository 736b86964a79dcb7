// Package health defines the tables of the node's health endpoint, the
// datapath side of Cilium's cilium-health: a network namespace with a veth
// to the node and a responder on the health port inside it.
//
//   - health-netns: the desired namespace, veth and responder, one row,
//     written by the datapath's deriver from the health endpoint row and
//     the router IP; reconciled into the kernel by datapath/healthep, which
//     records the outcome in the row's Status.
//   - health-interface: what the reconciler made (or adopted): the host
//     veth's name, index and MAC, the namespace path. Written only by
//     datapath/healthep; the endpoint manager copies it into the health
//     endpoint row, so that routes and programs treat the health endpoint
//     like a pod.
//   - health-probes: what the agent's prober (cells/healthcheck) saw when
//     it asked the responder from the node: reachable or not, why, how
//     fast. Read by GET /v1/healthz and `cellium status`.
package health

import (
	"net/netip"
	"strconv"
	"time"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"

	"github.com/cellium/cellium/statedb/reconciler"
)

// Cilium's names and numbers for the health endpoint.
const (
	// Port is the port the responder listens on (Cilium's
	// ClusterHealthPort).
	Port = 4240
	// Path is the HTTP path the responder answers on with 200.
	Path = "/hello"
	// NetnsName is the name of the health endpoint's network namespace
	// (`ip netns exec cilium-health ...`).
	NetnsName = "cilium-health"
	// HostIfName is the host side of the health endpoint's veth.
	HostIfName = "lxc_health"
	// IfName is the interface inside the health namespace.
	IfName = "cilium"
	// ContainerID is recorded in the host veth's alias and in the health
	// endpoint row, so that the CNI plugin's garbage collection and the
	// doctor know the veth belongs to an endpoint.
	ContainerID = "cilium-health"
)

// Table names.
const (
	NetnsTableName     = "health-netns"
	InterfaceTableName = "health-interface"
	ProbesTableName    = "health-probes"
)

// Netns is the desired health endpoint datapath: namespace NetnsPath with
// interface IfName carrying IPv4 (/32, default route via Gateway), its
// peer HostIfName in the node's namespace, and the responder listening on
// Port inside.
type Netns struct {
	// NetnsPath is where the namespace is pinned (the key).
	NetnsPath string `json:"netns-path"`
	// HostIfName and IfName name the two ends of the veth.
	HostIfName string `json:"host-interface"`
	IfName     string `json:"interface"`
	// ContainerID labels the host veth (its alias).
	ContainerID string `json:"container-id"`
	// IPv4 is the health IP; Gateway the node's router IP.
	IPv4    netip.Addr `json:"ipv4"`
	Gateway netip.Addr `json:"gateway"`
	// Port is the responder's port.
	Port int `json:"port"`
	// Status is the reconciliation status.
	Status reconciler.Status `json:"status"`
}

// SameAs reports whether n and o differ at most in Status.
func (n *Netns) SameAs(o *Netns) bool {
	c := *o
	c.Status = n.Status
	return *n == c
}

// WithStatus returns a copy of n with status s.
func (n *Netns) WithStatus(s reconciler.Status) *Netns {
	c := *n
	c.Status = s
	return &c
}

// TableHeader implements statedb.TableWritable.
func (*Netns) TableHeader() []string {
	return []string{"Netns", "HostInterface", "IPv4", "Gateway", "Port", "Status"}
}

// TableRow implements statedb.TableWritable.
func (n *Netns) TableRow() []string {
	return []string{n.NetnsPath, n.HostIfName, n.IPv4.String(), n.Gateway.String(), strconv.Itoa(n.Port), n.Status.String()}
}

// Interface is the health endpoint's veth as the reconciler made or
// adopted it.
type Interface struct {
	// HostIfName is the host side's name (the key), HostIfIndex its
	// ifindex, HostMAC its address.
	HostIfName  string `json:"host-interface"`
	HostIfIndex int    `json:"host-interface-index"`
	HostMAC     string `json:"host-mac"`
	// IfName is the interface inside the namespace, MAC its address.
	IfName string `json:"interface"`
	MAC    string `json:"mac"`
	// NetnsPath is the namespace's path; NetnsInode identifies the
	// namespace itself (it changes when the namespace is made anew).
	NetnsPath  string `json:"netns-path"`
	NetnsInode uint64 `json:"netns-inode"`
	// ContainerID is the veth's label.
	ContainerID string `json:"container-id"`
	// IPv4 is the health IP.
	IPv4 netip.Addr `json:"ipv4"`
}

// TableHeader implements statedb.TableWritable.
func (*Interface) TableHeader() []string {
	return []string{"HostInterface", "Index", "MAC", "Netns", "IPv4"}
}

// TableRow implements statedb.TableWritable.
func (i *Interface) TableRow() []string {
	return []string{i.HostIfName, strconv.Itoa(i.HostIfIndex), i.MAC, i.NetnsPath, i.IPv4.String()}
}

// ProbeHealthEndpoint is the Name of the probe of the local health
// endpoint.
const ProbeHealthEndpoint = "health-endpoint"

// Probe is the last result of probing one responder.
type Probe struct {
	// Name says what was probed (the key): ProbeHealthEndpoint.
	Name string `json:"name"`
	// IP is the address probed ("" while it has none).
	IP netip.Addr `json:"ip"`
	// Reachable is whether the last probe got an answer.
	Reachable bool `json:"reachable"`
	// Error says why not.
	Error string `json:"error,omitempty"`
	// Latency is how long the last successful probe took.
	Latency time.Duration `json:"latency,omitempty"`
	// LastProbed is when the last probe ended; LastReachable when one last
	// succeeded.
	LastProbed    time.Time `json:"last-probed"`
	LastReachable time.Time `json:"last-reachable,omitempty"`
}

// TableHeader implements statedb.TableWritable.
func (*Probe) TableHeader() []string {
	return []string{"Name", "IP", "Reachable", "Latency", "Error"}
}

// TableRow implements statedb.TableWritable.
func (p *Probe) TableRow() []string {
	ip := ""
	if p.IP.IsValid() {
		ip = p.IP.String()
	}
	return []string{p.Name, ip, strconv.FormatBool(p.Reachable), p.Latency.String(), p.Error}
}

// Indexes (all primary).
var (
	// NetnsIndex keys health-netns rows by namespace path.
	NetnsIndex = statedb.Index[*Netns, string]{
		Name:       "netns",
		FromObject: func(n *Netns) index.KeySet { return index.NewKeySet(index.String(n.NetnsPath)) },
		FromKey:    index.String,
		FromString: index.FromString,
		Unique:     true,
	}
	// InterfaceIndex keys health-interface rows by host interface name.
	InterfaceIndex = statedb.Index[*Interface, string]{
		Name:       "name",
		FromObject: func(i *Interface) index.KeySet { return index.NewKeySet(index.String(i.HostIfName)) },
		FromKey:    index.String,
		FromString: index.FromString,
		Unique:     true,
	}
	// ProbeIndex keys probes by name.
	ProbeIndex = statedb.Index[*Probe, string]{
		Name:       "name",
		FromObject: func(p *Probe) index.KeySet { return index.NewKeySet(index.String(p.Name)) },
		FromKey:    index.String,
		FromString: index.FromString,
		Unique:     true,
	}
)

// NewNetnsTable creates the health-netns table.
func NewNetnsTable(db *statedb.DB) (statedb.RWTable[*Netns], error) {
	return statedb.NewTable(db, NetnsTableName, NetnsIndex)
}

// NewInterfaceTable creates the health-interface table.
func NewInterfaceTable(db *statedb.DB) (statedb.RWTable[*Interface], error) {
	return statedb.NewTable(db, InterfaceTableName, InterfaceIndex)
}

// NewProbesTable creates the health-probes table.
func NewProbesTable(db *statedb.DB) (statedb.RWTable[*Probe], error) {
	return statedb.NewTable(db, ProbesTableName, ProbeIndex)
}

// NodePathsTableName is the table of the probes of other nodes.
const NodePathsTableName = "node-health"

// Kinds of NodePath.Type: what of the node a path leads to (Cilium's
// "type" label of cilium_node_health_connectivity_status).
const (
	// PathNode is the node's own address (its InternalIP).
	PathNode = "node"
	// PathEndpoint is the node's health endpoint (its spec.health.ipv4).
	PathEndpoint = "endpoint"
)

// Protocols of NodePath.Protocol.
const (
	// ProtocolICMP is an ICMP echo.
	ProtocolICMP = "icmp"
	// ProtocolHTTP is GET /hello on port 4240.
	ProtocolHTTP = "http"
)

// NodePath is the last result of probing one path to another node: its
// address or its health endpoint, by ICMP echo or HTTP. Written only by
// the node prober (cells/nodehealth); a node that goes takes its rows
// with it, and a node whose boot ID changes starts afresh.
type NodePath struct {
	// Node is the node's name.
	Node string `json:"node"`
	// Type is PathNode or PathEndpoint; Protocol ProtocolICMP or
	// ProtocolHTTP.
	Type     string `json:"type"`
	Protocol string `json:"protocol"`
	// IP is the address probed.
	IP netip.Addr `json:"ip"`
	// BootID is the node's boot ID when the path was first probed: a new
	// one is a new node (its history is dropped).
	BootID string `json:"boot-id,omitempty"`
	// Probed is false until the first probe ended.
	Probed bool `json:"probed"`
	// Reachable is whether the last probe got an answer; Error says why
	// not.
	Reachable bool   `json:"reachable"`
	Error     string `json:"error,omitempty"`
	// Latency is how long the last successful probe took.
	Latency time.Duration `json:"latency,omitempty"`
	// LastProbed is when the last probe ended; LastReachable when one
	// last succeeded (zero: never since the node appeared or rebooted).
	LastProbed    time.Time `json:"last-probed,omitzero"`
	LastReachable time.Time `json:"last-reachable,omitzero"`
}

// Key is the row's primary key: node/type/protocol.
func (p *NodePath) Key() string { return p.Node + "/" + p.Type + "/" + p.Protocol }

// TableHeader implements statedb.TableWritable.
func (*NodePath) TableHeader() []string {
	return []string{"Node", "Type", "Protocol", "IP", "Reachable", "Latency", "LastReachable", "Error"}
}

// TableRow implements statedb.TableWritable.
func (p *NodePath) TableRow() []string {
	last := ""
	if !p.LastReachable.IsZero() {
		last = p.LastReachable.UTC().Format(time.RFC3339)
	}
	reach := strconv.FormatBool(p.Reachable)
	if !p.Probed {
		reach = "unknown"
	}
	return []string{p.Node, p.Type, p.Protocol, p.IP.String(), reach, p.Latency.String(), last, p.Error}
}

var (
	// NodePathIndex keys node-health rows by Key().
	NodePathIndex = statedb.Index[*NodePath, string]{
		Name:       "path",
		FromObject: func(p *NodePath) index.KeySet { return index.NewKeySet(index.String(p.Key())) },
		FromKey:    index.String,
		FromString: index.FromString,
		Unique:     true,
	}
	// NodePathNodeIndex indexes node-health rows by node name.
	NodePathNodeIndex = statedb.Index[*NodePath, string]{
		Name:       "node",
		FromObject: func(p *NodePath) index.KeySet { return index.NewKeySet(index.String(p.Node)) },
		FromKey:    index.String,
		FromString: index.FromString,
	}
)

// NewNodePathsTable creates the node-health table.
func NewNodePathsTable(db *statedb.DB) (statedb.RWTable[*NodePath], error) {
	return statedb.NewTable(db, NodePathsTableName, NodePathIndex, NodePathNodeIndex)
}
