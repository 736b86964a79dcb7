package maps

import "strconv"

// Reasons in metrics keys and drop events: 0 counts forwarded packets,
// the others are Cilium's drop reason codes the programs emit.
const (
	ReasonForwarded      uint8 = 0
	DropInvalidSourceMAC uint8 = 130 // Invalid source mac
	DropInvalidSourceIP  uint8 = 132 // Invalid source ip
	DropPolicy           uint8 = 133 // Policy denied
	DropInvalid          uint8 = 134 // Invalid packet
	DropCTInvalidHeader  uint8 = 135 // CT: Truncated or invalid header
	DropUnknownL3        uint8 = 139 // Unsupported L3 protocol
	DropWriteError       uint8 = 141 // Error writing to packet
	DropNoTunnelKey      uint8 = 147 // Error retrieving tunnel key
	DropUnknownTarget    uint8 = 150 // Unknown L3 target address
	DropCTCreateFailed   uint8 = 155 // CT: Map insertion failed
	DropNoService        uint8 = 158 // Service backend not found
	DropNoTunnelEndpoint uint8 = 160 // No tunnel/encapsulation endpoint (datapath BUG!)
	DropNATNoMapping     uint8 = 167 // No mapping for NAT masquerade
	DropNoFIB            uint8 = 169 // FIB lookup failed
	DropInvalidIdentity  uint8 = 171 // Invalid identity
	DropUnknownSender    uint8 = 172 // Unknown sender
	DropIsClusterIP      uint8 = 174 // Is a ClusterIP
	DropFragNotFound     uint8 = 175 // First logical datagram fragment not found
	DropNotInSrcRange    uint8 = 177 // Denied by LB src range check
	DropPolicyDenyList   uint8 = 181 // Policy denied by denylist
)

// dropReasons are Cilium's words for its drop reason codes
// (pkg/monitor/api), for the codes cellium emits and their neighbours.
var dropReasons = map[uint8]string{
	0:   "Success",
	2:   "Invalid packet",
	130: "Invalid source mac",
	131: "Invalid destination mac",
	132: "Invalid source ip",
	133: "Policy denied",
	134: "Invalid packet",
	135: "CT: Truncated or invalid header",
	137: "CT: Unknown L4 protocol",
	139: "Unsupported L3 protocol",
	140: "Missed tail call",
	141: "Error writing to packet",
	142: "Unknown L4 protocol",
	143: "Unknown ICMPv4 code",
	144: "Unknown ICMPv4 type",
	147: "Error retrieving tunnel key",
	150: "Unknown L3 target address",
	151: "Stale or unroutable IP",
	155: "CT: Map insertion failed",
	157: "IP fragmentation not supported",
	158: "Service backend not found",
	160: "No tunnel/encapsulation endpoint (datapath BUG!)",
	163: "Unknown connection tracking state",
	174: "Is a ClusterIP",
	166: "Unsupported L2 protocol",
	167: "No mapping for NAT masquerade",
	169: "FIB lookup failed",
	171: "Invalid identity",
	172: "Unknown sender",
	175: "First logical datagram fragment not found",
	177: "Denied by LB src range check",
	181: "Policy denied by denylist",
}

// DropReasonName returns Cilium's text for a drop reason code, for
// example "Policy denied" for 133, or the number for an unknown code.
func DropReasonName(code uint8) string {
	if s, ok := dropReasons[code]; ok {
		return s
	}
	return strconv.Itoa(int(code))
}

// Trace observation points (the reason of trace events), Cilium's TRACE_*
// numbers.
const (
	TraceToLxc     uint8 = 0
	TraceToProxy   uint8 = 1
	TraceToHost    uint8 = 2
	TraceToStack   uint8 = 3
	TraceToOverlay uint8 = 4
	TraceFromLxc   uint8 = 5
	// TraceFromOverlay is a decapsulated packet on the tunnel device.
	TraceFromOverlay uint8 = 9
)

var traceObsPoints = map[uint8]string{
	TraceToLxc:       "to-endpoint",
	TraceToProxy:     "to-proxy",
	TraceToHost:      "to-host",
	TraceToStack:     "to-stack",
	TraceToOverlay:   "to-overlay",
	TraceFromLxc:     "from-endpoint",
	6:                "from-proxy",
	7:                "from-host",
	8:                "from-stack",
	TraceFromOverlay: "from-overlay",
	10:               "from-network",
	11:               "to-network",
}

// TraceObsPointName returns Cilium's name of a trace observation point
// ("to-endpoint", "from-endpoint", ...), or the number.
func TraceObsPointName(p uint8) string {
	if s, ok := traceObsPoints[p]; ok {
		return s
	}
	return strconv.Itoa(int(p))
}
