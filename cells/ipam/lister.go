package ipam

// Lister lists what IPAM has handed out; `cellium doctor` compares it with
// the endpoints.
type Lister interface {
	// Allocations returns every allocated address, the router's included,
	// in address order; nil before the node has pod CIDRs.
	Allocations() []Allocation
}

// Allocations implements Lister.
func (a *allocator) Allocations() []Allocation { return a.list() }

func asLister(a *allocator) Lister { return a }
