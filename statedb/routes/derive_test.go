package routes

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/cilium/statedb"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/nodes"
	"github.com/cellium/cellium/statedb/reconciler"
)

func ep(id uint16, ip, ifName string, state ciliumv2.EndpointState) *endpoints.Endpoint {
	e := &endpoints.Endpoint{ID: id, HostIfName: ifName, State: state}
	if ip != "" {
		e.IPv4 = netip.MustParseAddr(ip)
	}
	return e
}

func TestDerive(t *testing.T) {
	local := &nodes.LocalNode{Name: "n1", RouterIP: netip.MustParseAddr("10.200.0.1"),
		PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.200.0.0/24")}}
	eps := []*endpoints.Endpoint{
		ep(3, "10.200.0.30", "lxc3", ciliumv2.EndpointStateReady),
		ep(1, "10.200.0.5", "lxc1", ciliumv2.EndpointStateWaitingForIdentity),
		ep(2, "", "lxc2", ciliumv2.EndpointStateReady),                    // no IP
		ep(4, "10.200.0.40", "", ciliumv2.EndpointStateReady),             // no host veth (health)
		ep(5, "10.200.0.50", "lxc5", ciliumv2.EndpointStateDisconnecting), // going away
		ep(6, "10.200.0.60", "lxc6", ciliumv2.EndpointStateRestoring),     // restored: keep its route
	}
	d := Derive(local, slices.Values(eps))
	var got []string
	for _, r := range d.Routes {
		got = append(got, r.Prefix.String()+" dev "+r.Device)
	}
	want := []string{"10.200.0.5/32 dev lxc1", "10.200.0.30/32 dev lxc3", "10.200.0.60/32 dev lxc6"}
	if !slices.Equal(got, want) {
		t.Errorf("routes = %q, want %q", got, want)
	}
	if len(d.Devices) != 1 || d.Devices[0].Name != HostDevice || d.Devices[0].Peer != NetDevice ||
		!slices.Equal(d.Devices[0].Addrs, []netip.Prefix{netip.MustParsePrefix("10.200.0.1/32")}) {
		t.Errorf("devices = %+v, want cilium_host/cilium_net with 10.200.0.1/32", d.Devices)
	}
	sysctls := map[string]string{}
	for _, s := range d.Sysctls {
		sysctls[s.Name] = s.Value
	}
	if sysctls["net.ipv4.ip_forward"] != "1" || sysctls["net.ipv4.conf.cilium_host.rp_filter"] != "0" ||
		sysctls["net.ipv4.conf.all.rp_filter"] != "0" {
		t.Errorf("sysctls = %v", sysctls)
	}
}

// Without a router IP no device is wanted, but the routes to the pods are.
func TestDeriveWithoutRouterIP(t *testing.T) {
	eps := []*endpoints.Endpoint{ep(1, "10.200.0.5", "lxc1", ciliumv2.EndpointStateReady)}
	for _, local := range []*nodes.LocalNode{nil, {Name: "n1"}} {
		d := Derive(local, slices.Values(eps))
		if len(d.Devices) != 0 || len(d.Sysctls) != 0 || len(d.Routes) != 1 {
			t.Errorf("local %+v: got %d devices, %d sysctls, %d routes; want 0, 0, 1", local, len(d.Devices), len(d.Sysctls), len(d.Routes))
		}
	}
}

// Sync inserts new and changed rows as pending, leaves identical rows (and
// their status) alone, and deletes unwanted rows.
func TestSync(t *testing.T) {
	db := statedb.New()
	tbl, err := NewRoutesTable(db)
	if err != nil {
		t.Fatal(err)
	}
	status := func(r *Route) reconciler.Status { return r.Status }
	r := func(p, dev string) *Route { return &Route{Prefix: netip.MustParsePrefix(p), Device: dev} }

	wtxn := db.WriteTxn(tbl)
	if changed, err := Sync(wtxn, tbl, []*Route{r("10.0.0.1/32", "a"), r("10.0.0.2/32", "b")}, status); err != nil || !changed {
		t.Fatalf("first sync: changed=%v err=%v", changed, err)
	}
	// The reconciler marks one done.
	cur, _, _ := tbl.Get(wtxn, PrefixIndex.Query(netip.MustParsePrefix("10.0.0.1/32")))
	if _, _, err := tbl.Insert(wtxn, cur.WithStatus(reconciler.Done())); err != nil {
		t.Fatal(err)
	}
	if changed, _ := Sync(wtxn, tbl, []*Route{r("10.0.0.1/32", "a"), r("10.0.0.2/32", "b")}, status); changed {
		t.Error("second identical sync changed the table")
	}
	// The same device name with a new ifindex (a re-created veth) is a change.
	moved := r("10.0.0.1/32", "a")
	moved.DeviceIndex = 7
	if changed, _ := Sync(wtxn, tbl, []*Route{moved, r("10.0.0.2/32", "b")}, status); !changed {
		t.Error("a new device index is not a change")
	}
	// 10.0.0.2 moves to another device, 10.0.0.1 goes, 10.0.0.3 comes.
	if changed, _ := Sync(wtxn, tbl, []*Route{r("10.0.0.2/32", "c"), r("10.0.0.3/32", "d")}, status); !changed {
		t.Error("third sync changed nothing")
	}
	var got []string
	for x := range tbl.All(wtxn) {
		got = append(got, x.Prefix.String()+" "+x.Device+" "+x.Status.String())
	}
	want := []string{"10.0.0.2/32 c Pending", "10.0.0.3/32 d Pending"}
	if !slices.Equal(got, want) {
		t.Errorf("table = %q, want %q", got, want)
	}
	wtxn.Commit()
}

func TestDeriveMasquerade(t *testing.T) {
	if got := DeriveMasquerade(nil); got != nil {
		t.Errorf("no local node: %v", got)
	}
	local := &nodes.LocalNode{PodCIDRs: []netip.Prefix{
		netip.MustParsePrefix("fd00::/120"), netip.MustParsePrefix("10.200.1.0/24"), netip.MustParsePrefix("10.200.0.0/24"),
	}}
	var got []string
	for _, m := range DeriveMasquerade(local) {
		got = append(got, m.Prefix.String()+" except "+m.ExceptDevice)
	}
	want := []string{"10.200.0.0/24 except cilium_host", "10.200.1.0/24 except cilium_host"}
	if !slices.Equal(got, want) {
		t.Errorf("masquerade = %q, want %q", got, want)
	}
}

func remoteNodes() []*nodes.Node {
	n := func(name, ip string, cidrs ...string) *nodes.Node {
		x := &nodes.Node{Name: name, Addresses: []nodes.Address{{Type: nodes.AddressInternalIP, IP: netip.MustParseAddr(ip)}}}
		for _, c := range cidrs {
			x.PodCIDRs = append(x.PodCIDRs, netip.MustParsePrefix(c))
		}
		return x
	}
	return []*nodes.Node{
		n("self", "10.0.0.1", "10.200.1.0/24"),
		n("b", "10.0.0.2", "10.200.2.0/24", "fd00::/120"),
		n("c", "10.9.0.3", "10.200.3.0/24"),
	}
}

func routeStrings(rs []*Route) []string {
	var out []string
	for _, r := range rs {
		s := r.Prefix.String()
		if r.Gateway.IsValid() {
			s += " via " + r.Gateway.String()
		} else {
			s += " dev " + r.Device
		}
		out = append(out, s)
	}
	return out
}

// Tunnel mode: the tunnel device and every remote IPv4 pod CIDR into it;
// native mode with direct routes: via the node IP, same subnet only;
// native mode without: nothing.
func TestDeriveRemote(t *testing.T) {
	rs, devs := DeriveRemote(Remote{Mode: RoutingModeTunnel, TunnelPort: 8472, TunnelMTU: 1450}, "self", slices.Values(remoteNodes()))
	if got, want := routeStrings(rs), []string{"10.200.2.0/24 dev cilium_vxlan", "10.200.3.0/24 dev cilium_vxlan"}; !slices.Equal(got, want) {
		t.Errorf("tunnel routes = %q, want %q", got, want)
	}
	if len(devs) != 1 || devs[0].Name != TunnelDevice || devs[0].Kind != KindVXLAN || devs[0].Port != 8472 || devs[0].MTU != 1450 {
		t.Errorf("tunnel devices = %+v", devs)
	}
	same := func(a netip.Addr) bool { return netip.MustParsePrefix("10.0.0.0/24").Contains(a) }
	rs, devs = DeriveRemote(Remote{Mode: RoutingModeNative, AutoDirectNodeRoutes: true, SameSubnet: same}, "self", slices.Values(remoteNodes()))
	if got, want := routeStrings(rs), []string{"10.200.2.0/24 via 10.0.0.2"}; !slices.Equal(got, want) || len(devs) != 0 {
		t.Errorf("native routes = %q (devices %v), want %q and no device", got, devs, want)
	}
	if rs, devs := DeriveRemote(Remote{Mode: RoutingModeNative}, "self", slices.Values(remoteNodes())); rs != nil || devs != nil {
		t.Errorf("native without direct routes: %v %v", rs, devs)
	}
}

// TestDeriveRemoteRebootedNode: a node with a new boot ID (it rebooted)
// gets a route that is not the same as before, so the reconciler writes
// it again; the same boot ID gives the same route.
func TestDeriveRemoteRebootedNode(t *testing.T) {
	cfg := Remote{Mode: RoutingModeTunnel, TunnelPort: 8472, TunnelMTU: 1450}
	node := func(boot string) []*nodes.Node {
		return []*nodes.Node{{Name: "b", BootID: boot, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.200.2.0/24")},
			Addresses: []nodes.Address{{Type: nodes.AddressInternalIP, IP: netip.MustParseAddr("10.0.0.2")}}}}
	}
	a, _ := DeriveRemote(cfg, "self", slices.Values(node("boot-1")))
	again, _ := DeriveRemote(cfg, "self", slices.Values(node("boot-1")))
	rebooted, _ := DeriveRemote(cfg, "self", slices.Values(node("boot-2")))
	if len(a) != 1 || len(again) != 1 || len(rebooted) != 1 {
		t.Fatalf("routes %v %v %v", a, again, rebooted)
	}
	if a[0].NodeBootID != "boot-1" || !a[0].SameAs(again[0]) {
		t.Errorf("same boot ID: %+v vs %+v", a[0], again[0])
	}
	if a[0].SameAs(rebooted[0]) {
		t.Errorf("a new boot ID gives the same route %+v: it would not be written again", rebooted[0])
	}
}

func TestDeriveMasqueradeExceptions(t *testing.T) {
	local := &nodes.LocalNode{Name: "self", PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.200.1.0/24")}}
	got := DeriveMasqueradeExceptions(Remote{NativeRoutingCIDR: netip.MustParsePrefix("10.200.0.0/16")}, local, slices.Values(remoteNodes()))
	var s []string
	for _, m := range got {
		if !m.Except {
			t.Errorf("%s is not an exception", m.Prefix)
		}
		s = append(s, m.Prefix.String())
	}
	want := []string{"10.0.0.2/32", "10.9.0.3/32", "10.200.0.0/16", "10.200.2.0/24", "10.200.3.0/24"}
	if !slices.Equal(s, want) {
		t.Errorf("exceptions = %q, want %q", s, want)
	}
}
