package lb_test

import (
	"testing"

	"github.com/cellium/cellium/statedb/lb"
)

func TestServiceStateObject(t *testing.T) {
	for _, c := range []struct {
		owner    string
		ns, name string
		pod      bool
	}{
		{"ns/web", "ns", "web", false},
		{lb.HostPortOwner("ns/p"), "ns", "p", true},
		{lb.HostSocketOwner("ns/web"), "ns", "web", false},
		{lb.HostSocketOwner(lb.HostPortOwner("ns/p")), "ns", "p", true},
	} {
		s := &lb.ServiceState{Owner: c.owner}
		if ns, name := s.Object(); ns != c.ns || name != c.name || s.IsPod() != c.pod {
			t.Errorf("%s: Object() = %s, %s, IsPod() = %v; want %s, %s, %v", c.owner, ns, name, s.IsPod(), c.ns, c.name, c.pod)
		}
	}
}
