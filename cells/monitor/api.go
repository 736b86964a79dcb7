package monitor

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/cells/agentapi"
	"github.com/cellium/cellium/cells/hive/httpserve"
	hub "github.com/cellium/cellium/statedb/monitor"
)

func apiHandlers(cfg Config, h *hub.Hub) agentapi.HandlersOut {
	return agentapi.HandlersOut{Handlers: []agentapi.Handler{{
		Pattern: "GET /monitor",
		Handler: StreamHandler(h, cfg.MonitorQueueSize),
	}}}
}

// MaxFilterValues bounds the types plus endpoints of one GET /v1/monitor.
const MaxFilterValues = 256

// ParseFilter reads the query of GET /v1/monitor: type (drop, trace,
// policy-verdict) and endpoint (an endpoint ID), each repeatable or
// comma-separated.
//
// Errors: a message for the client naming the bad parameter and the
// values it takes.
func ParseFilter(q map[string][]string) (hub.Filter, error) {
	var f hub.Filter
	if n := len(q["type"]) + len(q["endpoint"]); n > MaxFilterValues {
		return f, fmt.Errorf("%d type and endpoint parameters: at most %d", n, MaxFilterValues)
	}
	for _, v := range q["type"] {
		for _, name := range strings.Split(v, ",") {
			t, err := hub.ParseType(strings.TrimSpace(name))
			if err != nil {
				return f, err
			}
			f.Types = append(f.Types, t)
		}
	}
	for _, v := range q["endpoint"] {
		for _, s := range strings.Split(v, ",") {
			n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 16)
			if err != nil || n == 0 {
				return f, fmt.Errorf("invalid endpoint %q: want an endpoint ID from 1 to 65535", s)
			}
			f.EndpointIDs = append(f.EndpointIDs, uint16(n))
		}
	}
	if len(f.Types)+len(f.EndpointIDs) > MaxFilterValues {
		return hub.Filter{}, fmt.Errorf("%d types and endpoints: at most %d", len(f.Types)+len(f.EndpointIDs), MaxFilterValues)
	}
	return f, nil
}

// StreamHandler serves the events of h as newline-delimited JSON
// (models.MonitorEvent), one event per line, flushed as it comes, until
// the client goes, the server stops or the hub closes. A client that
// reads too slowly loses events beyond queue buffered ones; a line of
// type "lost" tells it how many before the next event.
func StreamHandler(h *hub.Hub, queue int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		f, err := ParseFilter(r.URL.Query())
		if err != nil {
			agentapi.WriteError(w, http.StatusBadRequest, "%v", err)
			return
		}
		sub := h.Subscribe(f, queue)
		defer sub.Close()

		rc := http.NewResponseController(w)
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.Header().Set("Cache-Control", "no-cache")
		w.WriteHeader(http.StatusOK)
		// The client learns at once that the stream is open.
		if err := rc.Flush(); err != nil {
			return
		}
		enc := json.NewEncoder(w)
		var reported uint64
		// write encodes ev, preceded by a lost record when events were
		// lost since the last one.
		write := func(ev *hub.Event) error {
			if lost := sub.Lost(); lost > reported {
				if err := enc.Encode(models.MonitorEvent{Type: models.MonitorTypeLost, Timestamp: ev.Timestamp, Lost: lost - reported}); err != nil {
					return err
				}
				reported = lost
			}
			return enc.Encode(Model(ev))
		}
		for {
			select {
			case <-r.Context().Done():
				return
			case <-httpserve.Stopping(r.Context()):
				return
			case ev, ok := <-sub.Events():
				if !ok || write(&ev) != nil {
					return
				}
				// Write what is already queued, then flush once.
				for n := len(sub.Events()); n > 0; n-- {
					ev, ok := <-sub.Events()
					if !ok || write(&ev) != nil {
						return
					}
				}
				if rc.Flush() != nil {
					return
				}
			}
		}
	}
}

// Model converts a hub event to its wire form.
func Model(ev *hub.Event) models.MonitorEvent {
	m := models.MonitorEvent{
		Type:        ev.Type.String(),
		Timestamp:   ev.Timestamp,
		EndpointID:  ev.EndpointID,
		SrcIdentity: ev.SrcIdentity,
		DstIdentity: ev.DstIdentity,
		SrcPort:     ev.SrcPort,
		DstPort:     ev.DstPort,
		Protocol:    ProtocolName(ev.Protocol),
		Ifindex:     ev.Ifindex,
		Length:      ev.Length,
	}
	if ev.Direction != hub.DirectionUnknown {
		m.Direction = ev.Direction.String()
	}
	if ev.SrcIP.IsValid() {
		m.SrcIP = ev.SrcIP.String()
	}
	if ev.DstIP.IsValid() {
		m.DstIP = ev.DstIP.String()
	}
	switch ev.Protocol {
	case 6:
		m.TCPFlags = hub.TCPFlagsString(ev.TCPFlags)
	case 1:
		typ, code := ev.ICMPType, ev.ICMPCode
		m.ICMPType, m.ICMPCode = &typ, &code
	}
	if ev.ReplyKnown {
		reply := ev.IsReply
		m.IsReply = &reply
	}
	if ev.OrigDstIP.IsValid() {
		m.OrigDstIP, m.OrigDstPort = ev.OrigDstIP.String(), ev.OrigDstPort
	}
	switch ev.Type {
	case hub.TypeDrop:
		m.ReasonCode, m.Reason = ev.Reason, ev.ReasonName
		if m.Reason == "" {
			m.Reason = strconv.Itoa(int(ev.Reason))
		}
	case hub.TypeTrace:
		m.ObservationPointCode, m.ObservationPoint = ev.Reason, ev.ReasonName
		if m.ObservationPoint == "" {
			m.ObservationPoint = strconv.Itoa(int(ev.Reason))
		}
	case hub.TypePolicyVerdict:
		m.Verdict = ev.Verdict.String()
		// A deny or audit verdict carries the drop reason the policy gave.
		if ev.Reason != 0 {
			m.ReasonCode, m.Reason = ev.Reason, ev.ReasonName
		}
	}
	return m
}

// ProtocolName names an IP protocol the way `cellium monitor` prints it:
// tcp, udp, icmp, icmpv6, sctp, else the number ("" for 0).
func ProtocolName(p uint8) string {
	switch p {
	case 0:
		return ""
	case 1:
		return "icmp"
	case 6:
		return "tcp"
	case 17:
		return "udp"
	case 58:
		return "icmpv6"
	case 132:
		return "sctp"
	}
	return strconv.Itoa(int(p))
}
