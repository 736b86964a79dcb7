package policy

import (
	"cmp"
	"fmt"
	"math/bits"
	"strconv"

	"github.com/cellium/cellium/statedb/identity"
)

// Direction is the direction of traffic a policy entry is about, seen from
// the endpoint: Ingress for traffic it receives, Egress for traffic it
// sends. The values are those of the direction bit of the BPF policy key.
type Direction uint8

// The two directions.
const (
	Ingress Direction = 0
	Egress  Direction = 1
)

// String returns "ingress" or "egress".
func (d Direction) String() string {
	if d == Egress {
		return "egress"
	}
	return "ingress"
}

// IP protocol numbers used in keys. ProtoAny (0) matches every protocol.
const (
	ProtoAny  uint8 = 0
	ProtoICMP uint8 = 1
	ProtoTCP  uint8 = 6
	ProtoUDP  uint8 = 17
	ProtoSCTP uint8 = 132
)

// ProtoName returns the lower-case name of an IP protocol number ("tcp",
// "any") or its decimal number when it has no name here.
func ProtoName(p uint8) string {
	switch p {
	case ProtoAny:
		return "any"
	case ProtoICMP:
		return "icmp"
	case ProtoTCP:
		return "tcp"
	case ProtoUDP:
		return "udp"
	case ProtoSCTP:
		return "sctp"
	}
	return strconv.Itoa(int(p))
}

// staticPrefixBits is the length of the part of a BPF policy key that is
// always matched exactly: the 32-bit identity and the direction byte.
const staticPrefixBits = 40

// Key is the key of one policy map entry, with the fields of Cilium's BPF
// policy key (`policy_key`): the remote identity (0: any identity), the
// direction, the IP protocol (0: any) and a destination port prefix.
//
// The port prefix is Port with its top PortPrefixLen bits significant:
// PortPrefixLen 16 is the single port Port, 0 is every port. A key with
// Proto 0 has no port part (Port and PortPrefixLen are 0): the datapath can
// only wildcard the protocol together with the whole port.
//
// Key is a comparable value; build it with NewKey, which normalises it.
type Key struct {
	Identity      identity.NumericIdentity `json:"identity"`
	Direction     Direction                `json:"direction"`
	Proto         uint8                    `json:"proto"`
	Port          uint16                   `json:"port"`
	PortPrefixLen uint8                    `json:"port-prefix-len"`
}

// NewKey returns the key for (id, dir, proto, port prefix), with the port
// bits below the prefix cleared and the port part dropped when proto is 0.
// A prefix length above 16 is taken as 16.
func NewKey(id identity.NumericIdentity, dir Direction, proto uint8, port uint16, prefixLen uint8) Key {
	if proto == ProtoAny {
		port, prefixLen = 0, 0
	}
	prefixLen = min(prefixLen, 16)
	return Key{Identity: id, Direction: dir, Proto: proto, Port: port & portMask(prefixLen), PortPrefixLen: prefixLen}
}

func portMask(prefixLen uint8) uint16 {
	if prefixLen == 0 {
		return 0
	}
	return ^uint16(0) << (16 - prefixLen)
}

// PortRange returns the first and last port the key covers.
func (k Key) PortRange() (lo, hi uint16) {
	return k.Port, k.Port | ^portMask(k.PortPrefixLen)
}

// LPMPrefixLen returns the number of protocol and port bits the key matches
// (0 to 24): the `lpm_prefix_length` of the BPF policy entry.
func (k Key) LPMPrefixLen() uint8 {
	if k.Proto == ProtoAny {
		return 0
	}
	return 8 + k.PortPrefixLen
}

// PrefixLen returns the key's full LPM prefix length as the BPF map sees it:
// 40 static bits (identity and direction) plus LPMPrefixLen, 40 to 64.
func (k Key) PrefixLen() uint32 {
	return staticPrefixBits + uint32(k.LPMPrefixLen())
}

// Covers reports whether every packet other matches is also matched by k:
// same identity and direction, and k's protocol and port prefix contain
// other's.
func (k Key) Covers(other Key) bool {
	if k.Identity != other.Identity || k.Direction != other.Direction {
		return false
	}
	return k.coversL4(other)
}

// coversL4 is Covers without the identity and direction.
func (k Key) coversL4(other Key) bool {
	if k.Proto == ProtoAny {
		return true
	}
	if k.Proto != other.Proto || k.PortPrefixLen > other.PortPrefixLen {
		return false
	}
	return other.Port&portMask(k.PortPrefixLen) == k.Port
}

// MatchesL4 reports whether a packet of protocol proto to port port matches
// the key's protocol and port part.
func (k Key) MatchesL4(proto uint8, port uint16) bool {
	if k.Proto == ProtoAny {
		return true
	}
	return k.Proto == proto && port&portMask(k.PortPrefixLen) == k.Port
}

// String prints the key as "<direction> <identity> <proto>[/<ports>]", for
// example "ingress 1234 tcp/80", "egress 0 udp/1024-2047" or "ingress 2 any".
func (k Key) String() string {
	s := k.Direction.String() + " " + k.Identity.StringID() + " " + ProtoName(k.Proto)
	if k.Proto == ProtoAny || k.PortPrefixLen == 0 {
		return s
	}
	lo, hi := k.PortRange()
	if lo == hi {
		return s + "/" + strconv.Itoa(int(lo))
	}
	return fmt.Sprintf("%s/%d-%d", s, lo, hi)
}

// Compare orders keys by direction, identity, protocol, port and prefix
// length.
func (k Key) Compare(o Key) int {
	return cmp.Or(
		cmp.Compare(k.Direction, o.Direction),
		cmp.Compare(k.Identity, o.Identity),
		cmp.Compare(k.Proto, o.Proto),
		cmp.Compare(k.Port, o.Port),
		cmp.Compare(k.PortPrefixLen, o.PortPrefixLen),
	)
}

// PortPrefix is a block of ports: Port with its top PrefixLen bits
// significant.
type PortPrefix struct {
	Port      uint16
	PrefixLen uint8
}

// PortRangePrefixes splits the inclusive range lo..hi into the fewest port
// prefixes that cover exactly that range, in ascending order. lo > hi gives
// nothing; 0..65535 gives the single prefix 0/0.
func PortRangePrefixes(lo, hi uint16) []PortPrefix {
	if lo > hi {
		return nil
	}
	var out []PortPrefix
	cur, end := uint32(lo), uint32(hi)
	for cur <= end {
		// The largest aligned block starting at cur that does not pass end.
		size := uint32(1) << 16
		if cur != 0 {
			size = uint32(1) << bits.TrailingZeros32(cur)
		}
		for cur+size-1 > end {
			size >>= 1
		}
		out = append(out, PortPrefix{Port: uint16(cur), PrefixLen: uint8(16 - bits.TrailingZeros32(size))})
		cur += size
	}
	return out
}
