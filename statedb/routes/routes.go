// Package routes defines the tables of the node's host networking as the
// datapath wants it: the host device (cilium_host, carrying the router IP),
// one /32 route per local endpoint through its host-side veth, and the
// sysctls that make the node forward between them. The rows are derived
// from the endpoints and local-node tables (see Derive) and reconciled into
// the kernel by datapath/routing; each row carries its reconciliation
// status.
package routes

import (
	"cmp"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"

	"github.com/cellium/cellium/statedb/reconciler"
)

// Names of the host devices, as in Cilium: cilium_host carries the router
// IP; cilium_net is its veth peer.
const (
	HostDevice = "cilium_host"
	NetDevice  = "cilium_net"
)

// Protocol is the route protocol number (rtm_protocol, `ip route ... proto
// 201`) marking the routes the agent owns. Pruning deletes only routes with
// this protocol, so routes made by anyone else are never touched.
const Protocol = 201

// Table names.
const (
	RoutesTableName  = "host-routes"
	DevicesTableName = "host-devices"
	SysctlsTableName = "host-sysctls"
)

// Route is one desired route in the main table: Prefix through Device,
// scope link, protocol Protocol.
type Route struct {
	// Prefix is the destination (an endpoint's /32).
	Prefix netip.Prefix `json:"prefix"`
	// Device is the link the route goes through (the endpoint's host veth).
	Device string `json:"device"`
	// DeviceIndex is the device's ifindex as the endpoint recorded it. The
	// route is installed through the link named Device; the index only
	// makes a veth re-created under the same name a change, so the route
	// (which the kernel dropped with the old link) is put back at once.
	DeviceIndex int `json:"device-index,omitempty"`
	// EndpointID is the endpoint the route leads to (0 for a route to
	// another node's pod CIDR).
	EndpointID uint16 `json:"endpoint-id"`
	// Gateway, when valid, is the next hop (another node's InternalIP:
	// native routing's direct route to its pod CIDR); Device is then empty
	// and the kernel picks the device that reaches the gateway.
	Gateway netip.Addr `json:"gateway,omitzero"`
	// NodeBootID is the boot ID of the other node whose pod CIDR the route
	// leads to: a node that rebooted (a new boot ID) is treated as new,
	// its route written again. Empty for the routes to endpoints.
	NodeBootID string `json:"node-boot-id,omitempty"`
	// Status is the reconciliation status.
	Status reconciler.Status `json:"status"`
}

// SameAs reports whether r and o differ at most in Status.
func (r *Route) SameAs(o *Route) bool {
	return r.Prefix == o.Prefix && r.Device == o.Device && r.DeviceIndex == o.DeviceIndex && r.EndpointID == o.EndpointID &&
		r.Gateway == o.Gateway && r.NodeBootID == o.NodeBootID
}

// WithStatus returns a copy of r with status s.
func (r *Route) WithStatus(s reconciler.Status) *Route {
	c := *r
	c.Status = s
	return &c
}

// TableHeader implements statedb.TableWritable.
func (*Route) TableHeader() []string {
	return []string{"Prefix", "Device", "Gateway", "Endpoint", "Status"}
}

// TableRow implements statedb.TableWritable.
func (r *Route) TableRow() []string {
	gw := ""
	if r.Gateway.IsValid() {
		gw = r.Gateway.String()
	}
	return []string{r.Prefix.String(), r.Device, gw, strconv.Itoa(int(r.EndpointID)), r.Status.String()}
}

// Device kinds.
const (
	// KindVeth is a veth pair Name/Peer (cilium_host/cilium_net); the
	// zero Kind.
	KindVeth = ""
	// KindVXLAN is a VXLAN device in external (collect-metadata) mode on
	// UDP Port with MTU, ARP off: the tunnel device cilium_vxlan.
	KindVXLAN = "vxlan"
)

// Device is one desired host device: a veth pair Name/Peer, both up, with
// exactly Addrs on Name; or (Kind KindVXLAN) the tunnel device.
type Device struct {
	// Kind is KindVeth or KindVXLAN.
	Kind string `json:"kind,omitempty"`
	// Port is a VXLAN device's UDP port.
	Port int `json:"port,omitempty"`
	// MTU is a VXLAN device's MTU (0: the kernel's default).
	MTU int `json:"mtu,omitempty"`
	// Name is the device (cilium_host) and Peer its veth peer (cilium_net).
	Name string `json:"name"`
	Peer string `json:"peer"`
	// Addrs are the addresses of Name (the router IP as a /32).
	Addrs []netip.Prefix `json:"addresses"`
	// Status is the reconciliation status.
	Status reconciler.Status `json:"status"`
}

// SameAs reports whether d and o differ at most in Status.
func (d *Device) SameAs(o *Device) bool {
	return d.Name == o.Name && d.Peer == o.Peer && slices.Equal(d.Addrs, o.Addrs) && d.Kind == o.Kind &&
		d.Port == o.Port && d.MTU == o.MTU
}

// WithStatus returns a copy of d with status s.
func (d *Device) WithStatus(s reconciler.Status) *Device {
	c := *d
	c.Status = s
	return &c
}

// TableHeader implements statedb.TableWritable.
func (*Device) TableHeader() []string {
	return []string{"Name", "Kind", "Peer", "Addresses", "Port", "MTU", "Status"}
}

// TableRow implements statedb.TableWritable.
func (d *Device) TableRow() []string {
	addrs := make([]string, len(d.Addrs))
	for i, a := range d.Addrs {
		addrs[i] = a.String()
	}
	kind, port, mtu := d.Kind, "", ""
	if kind == KindVeth {
		kind = "veth"
	}
	if d.Port != 0 {
		port = strconv.Itoa(d.Port)
	}
	if d.MTU != 0 {
		mtu = strconv.Itoa(d.MTU)
	}
	return []string{d.Name, kind, d.Peer, strings.Join(addrs, ","), port, mtu, d.Status.String()}
}

// Sysctl is one desired kernel setting of the node's network namespace.
type Sysctl struct {
	// Name is the dotted name (net.ipv4.ip_forward).
	Name string `json:"name"`
	// Value is what it must read.
	Value string `json:"value"`
	// Status is the reconciliation status.
	Status reconciler.Status `json:"status"`
}

// Path is the file under /proc/sys.
func (s *Sysctl) Path() string { return strings.ReplaceAll(s.Name, ".", "/") }

// SameAs reports whether s and o differ at most in Status.
func (s *Sysctl) SameAs(o *Sysctl) bool { return s.Name == o.Name && s.Value == o.Value }

// WithStatus returns a copy of s with status st.
func (s *Sysctl) WithStatus(st reconciler.Status) *Sysctl {
	c := *s
	c.Status = st
	return &c
}

// TableHeader implements statedb.TableWritable.
func (*Sysctl) TableHeader() []string { return []string{"Name", "Value", "Status"} }

// TableRow implements statedb.TableWritable.
func (s *Sysctl) TableRow() []string { return []string{s.Name, s.Value, s.Status.String()} }

// Indexes (all primary).
var (
	// PrefixIndex keys routes by destination.
	PrefixIndex = statedb.Index[*Route, netip.Prefix]{
		Name:       "prefix",
		FromObject: func(r *Route) index.KeySet { return index.NewKeySet(index.NetIPPrefix(r.Prefix)) },
		FromKey:    index.NetIPPrefix,
		FromString: index.NetIPPrefixString,
		Unique:     true,
	}
	// DeviceNameIndex keys devices by name.
	DeviceNameIndex = statedb.Index[*Device, string]{
		Name:       "name",
		FromObject: func(d *Device) index.KeySet { return index.NewKeySet(index.String(d.Name)) },
		FromKey:    index.String,
		FromString: index.FromString,
		Unique:     true,
	}
	// SysctlNameIndex keys sysctls by dotted name.
	SysctlNameIndex = statedb.Index[*Sysctl, string]{
		Name:       "name",
		FromObject: func(s *Sysctl) index.KeySet { return index.NewKeySet(index.String(s.Name)) },
		FromKey:    index.String,
		FromString: index.FromString,
		Unique:     true,
	}
)

// NewRoutesTable creates the routes table.
func NewRoutesTable(db *statedb.DB) (statedb.RWTable[*Route], error) {
	return statedb.NewTable(db, RoutesTableName, PrefixIndex)
}

// NewDevicesTable creates the devices table.
func NewDevicesTable(db *statedb.DB) (statedb.RWTable[*Device], error) {
	return statedb.NewTable(db, DevicesTableName, DeviceNameIndex)
}

// NewSysctlsTable creates the sysctls table.
func NewSysctlsTable(db *statedb.DB) (statedb.RWTable[*Sysctl], error) {
	return statedb.NewTable(db, SysctlsTableName, SysctlNameIndex)
}

func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return cmp.Compare(a.Bits(), b.Bits())
}

// MasqueradeTableName is the name of the masquerade table.
const MasqueradeTableName = "host-masquerade"

// Masquerade is one desired source NAT rule: packets from Prefix (a pod
// CIDR) to anywhere outside it, leaving through any device but
// ExceptDevice, get the address of the device they leave through (Cilium's
// --enable-ipv4-masquerade with iptables).
type Masquerade struct {
	// Prefix is the source range (the node's pod CIDR); destinations in it
	// are not masqueraded.
	Prefix netip.Prefix `json:"prefix"`
	// ExceptDevice is the output device never masqueraded (cilium_host).
	ExceptDevice string `json:"except-device"`
	// Except marks a destination range that is never masqueraded (another
	// node's pod CIDR or address, the native routing CIDR): its rule
	// `ip daddr PREFIX return` comes before every masquerade rule.
	Except bool `json:"except,omitempty"`
	// Status is the reconciliation status.
	Status reconciler.Status `json:"status"`
}

// SameAs reports whether m and o differ at most in Status.
func (m *Masquerade) SameAs(o *Masquerade) bool {
	return m.Prefix == o.Prefix && m.ExceptDevice == o.ExceptDevice && m.Except == o.Except
}

// WithStatus returns a copy of m with status s.
func (m *Masquerade) WithStatus(s reconciler.Status) *Masquerade {
	c := *m
	c.Status = s
	return &c
}

// TableHeader implements statedb.TableWritable.
func (*Masquerade) TableHeader() []string {
	return []string{"Prefix", "ExceptDevice", "Except", "Status"}
}

// TableRow implements statedb.TableWritable.
func (m *Masquerade) TableRow() []string {
	return []string{m.Prefix.String(), m.ExceptDevice, strconv.FormatBool(m.Except), m.Status.String()}
}

// MasqueradePrefixIndex keys masquerade rules by source prefix.
var MasqueradePrefixIndex = statedb.Index[*Masquerade, netip.Prefix]{
	Name:       "prefix",
	FromObject: func(m *Masquerade) index.KeySet { return index.NewKeySet(index.NetIPPrefix(m.Prefix)) },
	FromKey:    index.NetIPPrefix,
	FromString: index.NetIPPrefixString,
	Unique:     true,
}

// NewMasqueradeTable creates the masquerade table.
func NewMasqueradeTable(db *statedb.DB) (statedb.RWTable[*Masquerade], error) {
	return statedb.NewTable(db, MasqueradeTableName, MasqueradePrefixIndex)
}
