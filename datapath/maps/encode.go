package maps

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"net"
	"net/netip"

	"github.com/cellium/cellium/datapath/bpf"
)

// Address families of keys and events (the kernel's AF_INET, AF_INET6).
const (
	FamilyIPv4 uint8 = 2
	FamilyIPv6 uint8 = 10
)

// The maps hold addresses as __u32 ip[4] in network byte order, read on a
// little-endian host (the programs are built for bpfel only): each word is
// the little-endian reading of four address bytes. An IPv4 address fills
// ip[0]; ip[1..3] are 0.

// addrWords encodes a into the ip[4] words of a key and returns its
// family. An IPv4-mapped IPv6 address counts as IPv4.
func addrWords(a netip.Addr) (w [4]uint32, family uint8, err error) {
	a = a.Unmap()
	switch {
	case a.Is4():
		b := a.As4()
		w[0] = binary.LittleEndian.Uint32(b[:])
		return w, FamilyIPv4, nil
	case a.Is6():
		b := a.As16()
		for i := range w {
			w[i] = binary.LittleEndian.Uint32(b[4*i:])
		}
		return w, FamilyIPv6, nil
	}
	return w, 0, fmt.Errorf("%w: address %v", ErrInvalidKey, a)
}

// wordsAddr decodes the ip[4] words of a key of the given family.
func wordsAddr(w [4]uint32, family uint8) (netip.Addr, error) {
	switch family {
	case FamilyIPv4:
		var b [4]byte
		binary.LittleEndian.PutUint32(b[:], w[0])
		return netip.AddrFrom4(b), nil
	case FamilyIPv6:
		var b [16]byte
		for i := range w {
			binary.LittleEndian.PutUint32(b[4*i:], w[i])
		}
		return netip.AddrFrom16(b), nil
	}
	return netip.Addr{}, fmt.Errorf("%w: address family %d", ErrInvalidKey, family)
}

// be32Addr decodes a single __be32 IPv4 address word.
func be32Addr(w uint32) netip.Addr {
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], w)
	return netip.AddrFrom4(b)
}

// addrBE32 encodes an IPv4 address as a __be32 word.
func addrBE32(a netip.Addr) (uint32, error) {
	a = a.Unmap()
	if !a.Is4() {
		return 0, fmt.Errorf("%w: %v is not an IPv4 address", ErrInvalidKey, a)
	}
	b := a.As4()
	return binary.LittleEndian.Uint32(b[:]), nil
}

// htons and ntohs convert between a port and its __be16 field.
func htons(v uint16) uint16 { return bits.ReverseBytes16(v) }
func ntohs(v uint16) uint16 { return bits.ReverseBytes16(v) }

// macBytes returns the 6 bytes of a MAC address (zero when m is nil) and
// an error for an address that is not 6 bytes long.
func macBytes(m net.HardwareAddr) ([6]uint8, error) {
	var b [6]uint8
	if m == nil {
		return b, nil
	}
	if len(m) != 6 {
		return b, fmt.Errorf("MAC address %v is not 6 bytes long", m)
	}
	copy(b[:], m)
	return b, nil
}

// MACConstant is bpf.MACConstant: the ENDPOINT_MAC value of mac.
func MACConstant(mac net.HardwareAddr) (uint64, error) { return bpf.MACConstant(mac) }
