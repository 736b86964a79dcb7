package link_test

import (
	"context"
	"fmt"
	"log"
	"net"

	"github.com/cellium/cellium/datapath/link"
)

func ExampleHostInterfaceName() {
	fmt.Println(link.HostInterfaceName("abc", "eth0"))
	// Output: lxcb133159de544
}

// A CNI ADD in the agent: make the pod's interface, then let the node
// route to it. (Not run: it needs root and a pod network namespace.)
func ExampleSetupEndpoint() {
	ctx := context.Background()
	spec := link.Spec{
		ContainerID: "0123456789abcdef",
		NetnsPath:   "/var/run/netns/cni-0123",
		MTU:         1500,
		RouteMTU:    1450,
		IPv4:        net.ParseIP("10.0.1.23"),
		Gateway:     net.ParseIP("10.0.1.1"),
	}
	res, err := link.SetupEndpoint(ctx, spec)
	if err != nil {
		log.Fatal(err)
	}
	if err := link.EnsurePodRoute(ctx, res.HostIfName, spec.IPv4); err != nil {
		_ = link.RemoveEndpoint(ctx, res.HostIfName, spec.NetnsPath)
		log.Fatal(err)
	}
	fmt.Println(res.HostIfName, res.HostIfIndex, res.PodIfName, res.PodMAC, &res.IPv4)
}
