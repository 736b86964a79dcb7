package policy

import (
	"strings"
	"testing"

	statepolicy "github.com/cellium/cellium/statedb/policy"
)

// TestParseDPortICMP: ICMP is a protocol a trace can ask about, with its
// type where other protocols have a port (as the datapath looks it up).
func TestParseDPortICMP(t *testing.T) {
	for in, want := range map[string]uint16{"0/icmp": 0, "8/ICMP": 8, "13/icmp": 13} {
		proto, port, err := ParseDPort(in)
		if err != nil || proto != statepolicy.ProtoICMP || port != want {
			t.Errorf("ParseDPort(%s) = %d, %d, %v; want ICMP, type %d", in, proto, port, err, want)
		}
	}
	if _, _, err := ParseDPort("256/ICMP"); err == nil || !strings.Contains(err.Error(), "0 to 255") {
		t.Errorf("ParseDPort(256/ICMP): %v, want an error naming the range", err)
	}
	if _, _, err := ParseDPort("80/GRE"); err == nil || !strings.Contains(err.Error(), "ICMP") {
		t.Errorf("ParseDPort(80/GRE): %v, want an error naming ICMP", err)
	}
}
