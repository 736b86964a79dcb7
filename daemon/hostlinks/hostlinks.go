// Package hostlinks gives the agent's doctor (cells/doctor) the node's
// endpoint veths, listed by datapath/link. Control-plane cells do not
// import datapath/, so the agent binary joins the two here. It is a package
// of its own, composed only by cellium-agent's main, so that what links
// the daemon package (the operator, for its command) does not link the
// datapath.
package hostlinks

import (
	"github.com/cellium/cellium/cells/doctor"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/datapath/link"
)

// Cell provides doctor.LinkLister for the agent's own network namespace.
var Cell = hive.Module("host-links", "Lists the endpoint veths of the node for the doctor",
	// The lister; it reads the links only when the doctor asks.
	hive.Provide(func() doctor.LinkLister { return Lister{} }),
)

// Lister lists the host-side endpoint links of Host's namespace.
type Lister struct {
	// Host is the node's namespace; the zero Host is the caller's.
	Host link.Host
}

// ListHostLinks implements doctor.LinkLister.
func (l Lister) ListHostLinks() ([]doctor.HostLink, error) {
	links, err := l.Host.ListHostInterfaces()
	if err != nil {
		return nil, err
	}
	out := make([]doctor.HostLink, 0, len(links))
	for _, hl := range links {
		out = append(out, doctor.HostLink{Name: hl.Name, ContainerID: hl.ContainerID})
	}
	return out, nil
}
