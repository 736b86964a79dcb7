package pool_test

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/cellium/cellium/cells/ipam/pool"
)

func Example() {
	p, err := pool.New(netip.MustParsePrefix("10.0.1.0/30"))
	if err != nil {
		panic(err)
	}
	fmt.Println("router:", p.RouterIP())
	a, _ := p.Allocate("default/web-0")
	fmt.Println("pod:", a)
	_, err = p.Allocate("default/web-1")
	fmt.Println(errors.Is(err, pool.ErrPoolExhausted), err)
	// Output:
	// router: 10.0.1.1
	// pod: 10.0.1.2
	// true IP pool exhausted: all 2 usable addresses of 10.0.1.0/30 are allocated, 10.0.1.1 to the router; delete pods or give the node more pod CIDRs
}
