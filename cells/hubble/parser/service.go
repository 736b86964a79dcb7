package parser

import (
	"net/netip"

	flowpb "github.com/cilium/cilium/api/v1/flow"

	"github.com/cellium/cellium/statedb/lb"
	"github.com/cellium/cellium/statedb/monitor"
)

// services names the Services of the flow's ends: the destination's is
// the frontend the datapath translated (OrigDstIP:OrigDstPort), else the
// destination itself when it is a frontend; the source's is the source
// when it is a frontend (a reply not translated back yet).
func (p *Parser) services(f *flowpb.Flow, ev *monitor.Event, src, dst netip.Addr) {
	if p.src.Services == nil || ev.Protocol != lb.TCP && ev.Protocol != lb.UDP {
		return
	}
	look := func(a netip.Addr, port uint16) *flowpb.Service {
		a = a.Unmap()
		if !a.Is4() || port == 0 {
			return nil
		}
		svc, _ := p.src.Services.ServiceByFrontend(lb.L4Addr{Addr: a, Port: port, Proto: ev.Protocol})
		return svc
	}
	if ev.OrigDstIP.IsValid() {
		f.DestinationService = look(ev.OrigDstIP, ev.OrigDstPort)
	}
	if f.DestinationService == nil {
		f.DestinationService = look(dst, ev.DstPort)
	}
	f.SourceService = look(src, ev.SrcPort)
}
