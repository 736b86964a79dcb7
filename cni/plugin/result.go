package plugin

import (
	"fmt"
	"io"
	"net"

	"github.com/containernetworking/cni/pkg/types"
	types040 "github.com/containernetworking/cni/pkg/types/040"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/vishvananda/netlink"

	"github.com/cellium/cellium/datapath/link"
)

// podInterface is the index of the pod's interface in Result.Interfaces
// (the host side is 0).
const podInterface = 1

// newResult describes what SetupEndpoint made as a current-version CNI
// result: the host side and the pod side of the veth with their MACs and
// MTU (the pod side with its sandbox), the pod's address on the pod side
// with the router IP as gateway, and the pod's routes: the scope-link /32
// to the gateway and the routes via it.
func newResult(r link.Result) *types100.Result {
	res := &types100.Result{
		CNIVersion: types100.ImplementedSpecVersion,
		Interfaces: []*types100.Interface{
			{Name: r.HostIfName, Mac: r.HostMAC.String(), Mtu: r.MTU},
			{Name: r.PodIfName, Mac: r.PodMAC.String(), Mtu: r.MTU, Sandbox: r.NetnsPath},
		},
		IPs: []*types100.IPConfig{{
			Interface: types100.Int(podInterface),
			Address:   r.IPv4,
			Gateway:   r.Gateway,
		}},
	}
	for _, rt := range r.Routes {
		route := &types.Route{Dst: rt.Dst, GW: rt.Via, MTU: rt.MTU}
		if rt.Via == nil {
			scope := int(netlink.SCOPE_LINK)
			route.Scope = &scope
		}
		res.Routes = append(res.Routes, route)
	}
	return res
}

// printResult writes res converted to cniVersion. Fields newer than
// cniVersion are left out: a route's mtu and scope and an interface's mtu
// exist from 1.1.0 on.
func printResult(w io.Writer, res *types100.Result, cniVersion string) error {
	converted, err := res.GetAsVersion(cniVersion)
	if err != nil {
		return fmt.Errorf("convert result to CNI version %s: %w", cniVersion, err)
	}
	if newer, _ := version.GreaterThanOrEqualTo(cniVersion, "1.1.0"); !newer {
		switch r := converted.(type) {
		case *types100.Result:
			for _, intf := range r.Interfaces {
				intf.Mtu = 0
			}
			r.Routes = legacyRoutes(r.Routes)
		case *types040.Result:
			r.Routes = legacyRoutes(r.Routes)
		}
	}
	return converted.PrintTo(w)
}

// legacyRoutes returns copies of routes with only dst and gw.
func legacyRoutes(routes []*types.Route) []*types.Route {
	out := make([]*types.Route, 0, len(routes))
	for _, r := range routes {
		out = append(out, &types.Route{Dst: r.Dst, GW: r.GW})
	}
	return out
}

// attachment is what CHECK finds of ADD's work in a prevResult.
type attachment struct {
	podMAC  net.HardwareAddr
	mtu     int
	ip      net.IP
	gateway net.IP
}

// findAttachment looks up the pod interface ifName in netns and its
// address in a prevResult.
func findAttachment(prev types.Result, ifName, netns string) (*attachment, error) {
	res, err := types100.NewResultFromResult(prev)
	if err != nil {
		return nil, fmt.Errorf("read prevResult: %w", err)
	}
	podIdx := -1
	for i, intf := range res.Interfaces {
		if intf.Name == ifName && intf.Sandbox == netns {
			podIdx = i
			break
		}
	}
	if podIdx < 0 {
		return nil, fmt.Errorf("prevResult has no interface %s in sandbox %s", ifName, netns)
	}
	a := &attachment{mtu: res.Interfaces[podIdx].Mtu}
	if mac := res.Interfaces[podIdx].Mac; mac != "" {
		if a.podMAC, err = net.ParseMAC(mac); err != nil {
			return nil, fmt.Errorf("prevResult interface %s: %w", ifName, err)
		}
	}
	for _, ipc := range res.IPs {
		if ipc.Interface != nil && *ipc.Interface == podIdx && ipc.Address.IP.To4() != nil {
			a.ip, a.gateway = ipc.Address.IP.To4(), ipc.Gateway
			break
		}
	}
	if a.ip == nil {
		return nil, fmt.Errorf("prevResult has no IPv4 address on interface %s", ifName)
	}
	return a, nil
}
