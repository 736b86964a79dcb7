package health

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/cellium/cellium/statedb/reconciler"
)

// SameAs ignores the status only; WithStatus copies.
func TestNetnsSameAs(t *testing.T) {
	a := &Netns{NetnsPath: "/var/run/netns/" + NetnsName, HostIfName: HostIfName, IfName: IfName, ContainerID: ContainerID,
		IPv4: netip.MustParseAddr("10.0.0.7"), Gateway: netip.MustParseAddr("10.0.0.1"), Port: Port}
	b := a.WithStatus(reconciler.Failed(errors.New("boom")))
	if !a.SameAs(b) || !b.SameAs(a) || a.Status.Kind == b.Status.Kind {
		t.Errorf("status change: SameAs %v/%v, kinds %q %q", a.SameAs(b), b.SameAs(a), a.Status.Kind, b.Status.Kind)
	}
	c := *a
	c.Gateway = netip.MustParseAddr("10.0.0.2")
	if a.SameAs(&c) {
		t.Errorf("a new gateway is the same row")
	}
}

// A probe without an address prints an empty IP column.
func TestProbeTableRow(t *testing.T) {
	p := &Probe{Name: ProbeHealthEndpoint, Error: "the node has no health endpoint yet"}
	row := p.TableRow()
	if len(row) != len(p.TableHeader()) || row[1] != "" || row[2] != "false" {
		t.Errorf("row %q", row)
	}
}
