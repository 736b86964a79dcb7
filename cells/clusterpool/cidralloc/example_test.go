package cidralloc_test

import (
	"fmt"
	"net/netip"

	"github.com/cellium/cellium/cells/clusterpool/cidralloc"
)

func Example() {
	a, err := cidralloc.New(cidralloc.Config{IPv4CIDRs: []string{"10.0.0.0/16"}, IPv4MaskSize: 24})
	if err != nil {
		panic(err)
	}
	// Restore what an existing CiliumNode already has.
	if err := a.Occupy("node-a", netip.MustParsePrefix("10.0.0.0/24")); err != nil {
		panic(err)
	}
	b, _ := a.Allocate("node-b")
	again, _ := a.Allocate("node-b")
	fmt.Println(b, again, a.Used(), "of", a.Capacity())

	_, err = cidralloc.New(cidralloc.Config{IPv4CIDRs: []string{"10.0.0.0/24"}, IPv4MaskSize: 16})
	fmt.Println(err)
	// Output:
	// 10.0.1.0/24 10.0.1.0/24 2 of 256
	// --cluster-pool-ipv4-mask-size=16: must be larger than the prefix length of 10.0.0.0/24 (--cluster-pool-ipv4-cidr), so that it splits into node CIDRs
}
