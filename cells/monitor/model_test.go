package monitor_test

import (
	"encoding/json"
	"net/netip"
	"strings"
	"testing"

	"github.com/cellium/cellium/cells/monitor"
	hub "github.com/cellium/cellium/statedb/monitor"
)

// TestModelNewFields: TCP flags, ICMP type and code (type 0 included),
// the reply direction when known and the Service a socket asked for
// reach the JSON of GET /v1/monitor.
func TestModelNewFields(t *testing.T) {
	tcp := hub.Event{Type: hub.TypeTrace, Protocol: 6, TCPFlags: 0x12, IsReply: true, ReplyKnown: true,
		OrigDstIP: netip.MustParseAddr("10.96.0.10"), OrigDstPort: 80}
	b, err := json.Marshal(monitor.Model(&tcp))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"tcp-flags":"SYN, ACK"`, `"is-reply":true`, `"orig-dst-ip":"10.96.0.10"`, `"orig-dst-port":80`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("%s lacks %s", b, want)
		}
	}
	icmp := hub.Event{Type: hub.TypeTrace, Protocol: 1, ICMPType: 0, ICMPCode: 0}
	if b, err = json.Marshal(monitor.Model(&icmp)); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"icmp-type":0`, `"icmp-code":0`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("%s lacks %s", b, want)
		}
	}
	for _, absent := range []string{"is-reply", "tcp-flags", "orig-dst"} {
		if strings.Contains(string(b), absent) {
			t.Errorf("%s has %s", b, absent)
		}
	}
}
