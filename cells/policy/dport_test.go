package policy

import (
	"strings"
	"testing"

	statepolicy "github.com/cellium/cellium/statedb/policy"
)

// TestParseDPortICMP: ICMP is a protocol a trace can ask about (the
// datapath looks echoes up with port 0), and it takes no port.
func TestParseDPortICMP(t *testing.T) {
	proto, port, err := ParseDPort("0/icmp")
	if err != nil || proto != statepolicy.ProtoICMP || port != 0 {
		t.Errorf("ParseDPort(0/icmp) = %d, %d, %v; want ICMP, 0", proto, port, err)
	}
	if _, _, err := ParseDPort("8/ICMP"); err == nil {
		t.Error("ParseDPort(8/ICMP): no error")
	}
	if _, _, err := ParseDPort("80/GRE"); err == nil || !strings.Contains(err.Error(), "ICMP") {
		t.Errorf("ParseDPort(80/GRE): %v, want an error naming ICMP", err)
	}
}
