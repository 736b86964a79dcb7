package bpf_test

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"

	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/policy"
)

// This file is the reference model of bpf/lxc.c that FuzzDatapath
// (fuzz_privileged_test.go) compares the programs with: the datapath's
// verdicts written as plain Go, one function per step of the security
// model (Documentation/concepts/datapath-security.md, bpf/README.md).
// It parses the same bytes the programs get, keeps its own conntrack and
// fragment tables, and decides policy with statedb/policy
// DirectionPolicy.Decide, the control plane's own reading of an
// endpoint's policy map. Where it and the programs disagree, one of them
// is wrong: read it as the specification.

// modelEndpoint is one local endpoint: its load-time constants
// (ENDPOINT_ID, SECURITY_IDENTITY, ...) and its policy map. MAC and Addr
// are always set here (lxc.c skips the MAC check for a zero
// ENDPOINT_MAC and drops every IPv4 packet without ENDPOINT_IPV4: cases
// the model leaves out).
type modelEndpoint struct {
	ID       uint16
	Identity identity.NumericIdentity
	IfIndex  uint32
	MAC      net.HardwareAddr
	Addr     netip.Addr
	Audit    bool // POLICY_AUDIT_MODE
	// Policy is the policy map, per policy.Direction.
	Policy [2]policy.DirectionPolicy
}

// modelLXC is a cellium_lxc entry: which endpoint owns an address.
type modelLXC struct {
	ID      uint16
	IfIndex uint32
}

// modelPrefix is a cellium_ipcache entry.
type modelPrefix struct {
	Prefix netip.Prefix
	Entry  maps.IPCacheEntry
}

// modelFragID keys cellium_ipv4_frag_datagrams.
type modelFragID struct {
	Src, Dst netip.Addr
	ID       uint16
	Proto    uint8
}

// modelFragPorts are the ports a first fragment recorded.
type modelFragPorts struct{ SrcPort, DstPort, PolicyPort uint16 }

// model is the state the programs read and write: the global maps and
// the endpoints' constants and policy maps. Now is the clock
// (bpf_ktime_get_ns) of the next packet.
type model struct {
	// SCTPPorts parses SCTP's ports as UDP's, for the policy and
	// conntrack: what Kubernetes means by a NetworkPolicy port of protocol
	// SCTP, and what the policy engine writes (SCTP keys with ports), as
	// lxc.c does (TestPrivilegedFuzzDatapathSCTPPorts); the fuzzer runs
	// with it.
	SCTPPorts bool
	Now       uint64
	Endpoints map[uint16]*modelEndpoint
	LXC       map[netip.Addr]modelLXC
	// Slots is cellium_policy_progs: endpoint ID -> the endpoint whose
	// cil_lxc_policy the slot holds.
	Slots   map[uint16]*modelEndpoint
	IPCache []modelPrefix
	CT      map[maps.CTKey]maps.CTEntry
	Frags   map[modelFragID]modelFragPorts
}

// verdict is what a program did with a packet: its return code and, for a
// drop, the reason and the endpoint whose program dropped it (the
// destination's for a drop in a tail-called cil_lxc_policy).
type verdict struct {
	Ret      uint32
	Reason   uint8
	Endpoint uint16
	// Step names the step of the model that decided (not compared: the
	// programs do not say), for reports.
	Step string
}

const (
	modelReplyRecheck = 1_000_000_000 // CT_REPLY_RECHECK_NS
	nsPerSec          = 1_000_000_000

	ipProtoICMP = 1
	ipProtoTCP  = 6
	ipProtoUDP  = 17
	ipProtoSCTP = 132

	icmpEchoReply    = 0
	icmpDestUnreach  = 3
	icmpEcho         = 8
	icmpTimeExceeded = 11
	icmpParamProblem = 12

	tcpRST = 0x04
)

func passed(step string) verdict { return verdict{Ret: tcActOK, Step: step} }

func dropped(ep *modelEndpoint, reason uint8, step string) verdict {
	return verdict{Ret: tcActShot, Reason: reason, Endpoint: ep.ID, Step: step}
}

// Parsing.

type fragKind uint8

const (
	fragNone  fragKind = iota
	fragFirst          // more fragments follow, offset 0: it has the L4 header
	fragLater          // offset > 0: no L4 header, ports from the first
)

// quote is the packet an ICMP error quotes, in its own orientation.
type quote struct {
	Src, Dst         netip.Addr
	SrcPort, DstPort uint16
	Proto            uint8
}

// parsed is a packet as the programs see it. SrcPort and DstPort are the
// conntrack ports (an ICMP echo's id is the request's source port and the
// reply's destination port); PolicyPort is the port the policy sees (for
// ICMP the type).
type parsed struct {
	ARP                          bool
	Src, Dst                     netip.Addr
	SrcPort, DstPort, PolicyPort uint16
	IPID                         uint16
	Proto, TCPFlags, ICMPType    uint8
	Frag                         fragKind
	Quote                        *quote // an ICMP error's quoted packet, when usable
}

// parse reads Ethernet, IPv4 and the L4 header. It returns 0 or the drop
// reason: other EtherTypes than IPv4 and ARP (IPv6 too) are 139; a bad
// IPv4 header, or a datagram (tot_len) longer than the frame, 134; an L4
// header that does not fit inside the datagram, 135. Bytes after the
// datagram (Ethernet padding) are never read. A fragment after the first
// has no L4 header; an ICMP error (not fragmented) has its quote parsed.
func parse(pkt []byte, sctpPorts bool) (parsed, uint8) {
	var p parsed
	switch binary.BigEndian.Uint16(pkt[12:14]) {
	case 0x0800:
	case 0x0806:
		p.ARP = true
		return p, 0
	default:
		return p, maps.DropUnknownL3
	}
	if len(pkt) < 14+20 {
		return p, maps.DropInvalid
	}
	ip := pkt[14:]
	ihl := int(ip[0]&0x0f) * 4
	totLen := int(binary.BigEndian.Uint16(ip[2:4]))
	if ip[0]>>4 != 4 || ihl < 20 || totLen < ihl || totLen > len(ip) {
		return p, maps.DropInvalid
	}
	dgram := ip[:totLen] // what follows is padding
	p.Proto = ip[9]
	p.Src = netip.AddrFrom4([4]byte(ip[12:16]))
	p.Dst = netip.AddrFrom4([4]byte(ip[16:20]))
	p.IPID = binary.BigEndian.Uint16(ip[4:6])
	frag := binary.BigEndian.Uint16(ip[6:8])
	if frag&0x1fff != 0 {
		p.Frag = fragLater
		return p, 0
	}
	if frag&0x2000 != 0 {
		p.Frag = fragFirst
	}
	l4 := dgram[ihl:]
	switch p.Proto {
	case ipProtoTCP:
		if len(l4) < 20 {
			return p, maps.DropCTInvalidHeader
		}
		if doff := int(l4[12]>>4) * 4; doff < 20 || doff > len(l4) {
			return p, maps.DropCTInvalidHeader
		}
		p.SrcPort = binary.BigEndian.Uint16(l4[0:2])
		p.DstPort = binary.BigEndian.Uint16(l4[2:4])
		p.PolicyPort = p.DstPort
		p.TCPFlags = l4[13]
	case ipProtoUDP:
		if len(l4) < 8 {
			return p, maps.DropCTInvalidHeader
		}
		p.SrcPort = binary.BigEndian.Uint16(l4[0:2])
		p.DstPort = binary.BigEndian.Uint16(l4[2:4])
		p.PolicyPort = p.DstPort
	case ipProtoSCTP:
		if !sctpPorts {
			break
		}
		if len(l4) < 12 { // the common header
			return p, maps.DropCTInvalidHeader
		}
		p.SrcPort = binary.BigEndian.Uint16(l4[0:2])
		p.DstPort = binary.BigEndian.Uint16(l4[2:4])
		p.PolicyPort = p.DstPort
	case ipProtoICMP:
		if len(l4) < 8 {
			return p, maps.DropCTInvalidHeader
		}
		p.ICMPType = l4[0]
		p.PolicyPort = uint16(l4[0])
		switch {
		case l4[0] == icmpEcho:
			p.SrcPort = binary.BigEndian.Uint16(l4[4:6])
		case l4[0] == icmpEchoReply:
			p.DstPort = binary.BigEndian.Uint16(l4[4:6])
		case icmpIsError(l4[0]) && p.Frag == fragNone:
			q, reason := parseQuote(l4[8:], sctpPorts)
			p.Quote = q
			return p, reason
		}
	}
	return p, 0
}

func icmpIsError(typ uint8) bool {
	return typ == icmpDestUnreach || typ == icmpTimeExceeded || typ == icmpParamProblem
}

// parseQuote reads the quoted IPv4 header and 8 bytes of L4 header of an
// ICMP error (b: the rest of the error's datagram). A quote that does not
// fit is 135, a bad quoted header 134; a quote of an ICMP message other
// than an echo or echo reply is no connection's (nil).
func parseQuote(b []byte, sctpPorts bool) (*quote, uint8) {
	if len(b) < 20 {
		return nil, maps.DropCTInvalidHeader
	}
	ihl := int(b[0]&0x0f) * 4
	if b[0]>>4 != 4 || ihl < 20 {
		return nil, maps.DropInvalid
	}
	if len(b) < ihl+8 {
		return nil, maps.DropCTInvalidHeader
	}
	q := &quote{
		Src:   netip.AddrFrom4([4]byte(b[12:16])),
		Dst:   netip.AddrFrom4([4]byte(b[16:20])),
		Proto: b[9],
	}
	l4 := b[ihl:]
	switch {
	case q.Proto == ipProtoTCP, q.Proto == ipProtoUDP, q.Proto == ipProtoSCTP && sctpPorts:
		q.SrcPort = binary.BigEndian.Uint16(l4[0:2])
		q.DstPort = binary.BigEndian.Uint16(l4[2:4])
	case q.Proto == ipProtoICMP:
		switch l4[0] {
		case icmpEcho:
			q.SrcPort = binary.BigEndian.Uint16(l4[4:6])
		case icmpEchoReply:
			q.DstPort = binary.BigEndian.Uint16(l4[4:6])
		default:
			return nil, 0 // an error about an error: not related
		}
	}
	return q, 0
}

// Source validation.

// validateSource checks what the pod sends: the Ethernet source must be
// the endpoint's MAC (130) and the IPv4 source its address (132); an ARP
// packet must be for IPv4 over Ethernet (134) and name the endpoint's MAC
// and address as sender.
func (ep *modelEndpoint) validateSource(pkt []byte, p parsed) uint8 {
	if !bytes.Equal(pkt[6:12], ep.MAC) {
		return maps.DropInvalidSourceMAC
	}
	if !p.ARP {
		if p.Src != ep.Addr {
			return maps.DropInvalidSourceIP
		}
		return 0
	}
	arp := pkt[14:]
	if len(arp) < 28 {
		return maps.DropInvalid
	}
	if !bytes.Equal(arp[0:6], []byte{0, 1, 8, 0, 6, 4}) {
		return maps.DropInvalid
	}
	if !bytes.Equal(arp[8:14], ep.MAC) {
		return maps.DropInvalidSourceMAC
	}
	if netip.AddrFrom4([4]byte(arp[14:18])) != ep.Addr {
		return maps.DropInvalidSourceIP
	}
	return 0
}

// Identities and policy.

// ipcacheLookup returns the identity of addr (world when no prefix holds
// it) and the CIDR identity its longest prefix carries (0: none).
func (m *model) ipcacheLookup(addr netip.Addr) (id, cidr identity.NumericIdentity) {
	best := -1
	for _, e := range m.IPCache {
		if e.Prefix.Contains(addr) && e.Prefix.Bits() > best {
			best, id, cidr = e.Prefix.Bits(), e.Entry.Identity, e.Entry.CIDRIdentity
		}
	}
	if best < 0 {
		return identity.ReservedIdentityWorld, 0
	}
	return id, cidr
}

// decideOne is Decide's verdict as a drop reason: 0 (allowed), 133 (no
// entry allows) or 181 (a deny entry).
func decideOne(dp *policy.DirectionPolicy, id identity.NumericIdentity, proto uint8, port uint16) uint8 {
	allowed, decided, matched := dp.Decide(id, proto, port)
	switch {
	case allowed:
		return 0
	case matched && decided.Deny:
		return maps.DropPolicyDenyList
	}
	return maps.DropPolicy
}

// decide is the verdict on a remote identity and the CIDR identity
// holding its address (Documentation/concepts/policy.md, "CIDR rules and
// pod addresses"): a deny of either is final, an allow of either allows.
func decide(dp *policy.DirectionPolicy, id, cidr identity.NumericIdentity, proto uint8, port uint16) uint8 {
	v := decideOne(dp, id, proto, port)
	if cidr == 0 || cidr == id || v == maps.DropPolicyDenyList {
		return v
	}
	c := decideOne(dp, cidr, proto, port)
	if c == maps.DropPolicyDenyList || v != 0 {
		return c
	}
	return 0 // the identity's allow stands
}

// Conntrack.

func ctLifetime(proto uint8, flags uint16) uint64 {
	switch {
	case proto != ipProtoTCP:
		return 60 * nsPerSec
	case flags&maps.CTFlagClosing != 0:
		return 10 * nsPerSec
	case flags&maps.CTFlagReplySeen != 0:
		return 21600 * nsPerSec
	}
	return 60 * nsPerSec
}

func (m *model) live(k maps.CTKey) (maps.CTEntry, bool) {
	e, ok := m.CT[k]
	return e, ok && e.Expires > m.Now
}

// ctUpdate records a packet of a live entry: a reply, or one in the
// connection's own direction (whose path, via the stack or not, the entry
// then remembers). A RST, or a FIN each way, closes the connection.
func (m *model) ctUpdate(k maps.CTKey, e maps.CTEntry, p parsed, reply bool, viaStack uint16) {
	if reply {
		e.RxPackets++
		e.Flags |= maps.CTFlagReplySeen
		if p.TCPFlags&tcpFIN != 0 {
			e.Flags |= maps.CTFlagRxFIN
		}
	} else {
		e.TxPackets++
		e.Flags = e.Flags&^maps.CTFlagViaStack | viaStack
		if p.TCPFlags&tcpFIN != 0 {
			e.Flags |= maps.CTFlagTxFIN
		}
	}
	if p.TCPFlags&tcpRST != 0 || e.Flags&(maps.CTFlagTxFIN|maps.CTFlagRxFIN) == maps.CTFlagTxFIN|maps.CTFlagRxFIN {
		e.Flags |= maps.CTFlagClosing
	}
	e.Expires = m.Now + ctLifetime(p.Proto, e.Flags)
	m.CT[k] = e
}

// opensConnection: a packet that matched no entry makes one only if it is
// a TCP SYN (without ACK, RST or FIN), an ICMP echo request, or a UDP or
// other datagram.
func opensConnection(p parsed) bool {
	switch p.Proto {
	case ipProtoTCP:
		return p.TCPFlags&(tcpSYN|tcpACK|tcpRST|tcpFIN) == tcpSYN
	case ipProtoICMP:
		return p.ICMPType == icmpEcho
	}
	return true
}

// ctDir is the conntrack direction of a hook.
func ctDir(egress bool) maps.CTDir {
	if egress {
		return maps.CTEgress
	}
	return maps.CTIngress
}

func polDir(egress bool) policy.Direction {
	if egress {
		return policy.Egress
	}
	return policy.Ingress
}

// related reports whether an ICMP error is about a live connection of ep:
// the quote is a packet of it in either orientation, and the error goes
// back along it (coming in, the quote's source is where it goes; going
// out, it goes to the quote's source from its destination).
func (m *model) related(ep *modelEndpoint, p parsed, egress bool) bool {
	q := p.Quote
	if q == nil {
		return false
	}
	if egress && (q.Dst != p.Src || q.Src != p.Dst) || !egress && q.Src != p.Dst {
		return false
	}
	own := maps.CTKey{Src: q.Src, Dst: q.Dst, SrcPort: q.SrcPort, DstPort: q.DstPort, Proto: q.Proto, Dir: ctDir(!egress), Endpoint: ep.ID}
	if _, ok := m.live(own); ok {
		return true
	}
	rev := maps.CTKey{Src: q.Dst, Dst: q.Src, SrcPort: q.DstPort, DstPort: q.SrcPort, Proto: q.Proto, Dir: ctDir(egress), Endpoint: ep.ID}
	_, ok := m.live(rev)
	return ok
}

// The hooks.

// handle applies ep's policy in one direction (egress: cil_from_container;
// else cil_to_container, or cil_lxc_policy with localSrc, the sending
// endpoint's identity from skb->cb[0]). viaStack is CT_F_VIA_STACK for
// cil_to_container. replyViaStack reports an egress reply of a connection
// that came in through the stack.
func (m *model) handle(ep *modelEndpoint, pkt []byte, egress bool, localSrc identity.NumericIdentity, viaStack uint16) (v verdict, replyViaStack bool) {
	p, reason := parse(pkt, m.SCTPPorts)
	if reason != 0 {
		return dropped(ep, reason, "parse"), false
	}
	if egress {
		if bad := ep.validateSource(pkt, p); bad != 0 {
			return dropped(ep, bad, "source"), false
		}
	}
	if p.ARP {
		return passed("arp"), false
	}
	if p.Frag != fragNone {
		id := modelFragID{Src: p.Src, Dst: p.Dst, ID: p.IPID, Proto: p.Proto}
		if p.Frag == fragFirst {
			m.Frags[id] = modelFragPorts{p.SrcPort, p.DstPort, p.PolicyPort}
		} else {
			ports, ok := m.Frags[id]
			if !ok {
				return dropped(ep, maps.DropFragNotFound, "fragment"), false
			}
			p.SrcPort, p.DstPort, p.PolicyPort = ports.SrcPort, ports.DstPort, ports.PolicyPort
			if p.Proto == ipProtoICMP {
				p.ICMPType = uint8(ports.PolicyPort)
			}
		}
	}

	// A reply of a connection the other hook admitted.
	replyKey := maps.CTKey{Src: p.Dst, Dst: p.Src, SrcPort: p.DstPort, DstPort: p.SrcPort, Proto: p.Proto, Dir: ctDir(!egress), Endpoint: ep.ID}
	if e, ok := m.live(replyKey); ok {
		if reason := m.replyAllowed(ep, replyKey, &e, p, egress, localSrc); reason != 0 {
			m.CT[replyKey] = e
			return dropped(ep, reason, "reply denied"), false
		}
		m.ctUpdate(replyKey, e, p, true, 0)
		return passed("reply"), egress && e.Flags&maps.CTFlagViaStack != 0
	}

	// An ICMP error about a live connection of the endpoint.
	if p.Proto == ipProtoICMP && icmpIsError(p.ICMPType) && m.related(ep, p, egress) {
		return passed("related"), false
	}

	// The remote's identity: the sending endpoint's own when the
	// same-node redirect handed it over, else the ipcache's.
	remote := p.Src
	if egress {
		remote = p.Dst
	}
	var remoteID, cidrID identity.NumericIdentity
	if !egress && localSrc != 0 {
		remoteID = localSrc
	} else {
		remoteID, cidrID = m.ipcacheLookup(remote)
	}

	key := maps.CTKey{Src: p.Src, Dst: p.Dst, SrcPort: p.SrcPort, DstPort: p.DstPort, Proto: p.Proto, Dir: ctDir(egress), Endpoint: ep.ID}
	e, established := m.live(key)
	// A new SYN on a closing tuple starts a new connection.
	if established && e.Flags&maps.CTFlagClosing != 0 && p.TCPFlags&(tcpSYN|tcpACK) == tcpSYN {
		established = false
	}

	dp := &ep.Policy[polDir(egress)]
	ret := decideOne(dp, remoteID, p.Proto, p.PolicyPort)
	// A same-node source's CIDR identity is looked up for a new
	// connection, and for an established one only when its identity is
	// not allowed (bpf/README.md, "Same-node redirect").
	if !egress && localSrc != 0 && (!established || ret == maps.DropPolicy) {
		_, cidrID = m.ipcacheLookup(p.Src)
	}
	if cidrID != 0 && cidrID != remoteID && ret != maps.DropPolicyDenyList {
		ret = decide(dp, remoteID, cidrID, p.Proto, p.PolicyPort)
	}

	if established {
		if ret != 0 && !ep.Audit {
			return dropped(ep, ret, "established"), false
		}
		m.ctUpdate(key, e, p, false, viaStack)
		e = m.CT[key]
		e.Checked = m.Now
		e.Flags &^= maps.CTFlagDenied | maps.CTFlagDenyList
		m.CT[key] = e
		return passed("established"), false
	}
	if ret != 0 && !ep.Audit {
		return dropped(ep, ret, "policy"), false
	}
	if !opensConnection(p) {
		return passed("opens nothing"), false
	}
	n := maps.CTEntry{TxPackets: 1, RemoteID: remoteID, Flags: viaStack, PolicyPort: p.PolicyPort, Checked: m.Now}
	if p.Proto == ipProtoTCP {
		n.Flags |= maps.CTFlagSYN
	}
	if ret != 0 {
		n.Flags |= maps.CTFlagAudit
	}
	n.Expires = m.Now + ctLifetime(p.Proto, n.Flags)
	m.CT[key] = n
	if ret != 0 {
		return passed("new (audit)"), false
	}
	return passed("new"), false
}

// replyAllowed: a reply passes on its entry's word, but at most a second
// (CT_REPLY_RECHECK_NS) after the last check of the connection's own
// direction its policy is checked again; a denial marks the entry and
// drops replies (unless the endpoint or the entry is in audit mode). It
// returns 0 or the drop reason, and updates *e.
func (m *model) replyAllowed(ep *modelEndpoint, k maps.CTKey, e *maps.CTEntry, p parsed, egress bool, localSrc identity.NumericIdentity) uint8 {
	if m.Now-e.Checked >= modelReplyRecheck {
		// The connection's remote: this packet's destination when it
		// goes out, else its source.
		var remoteID, cidrID identity.NumericIdentity
		if egress {
			remoteID, cidrID = m.ipcacheLookup(p.Dst)
		} else {
			remoteID, cidrID = m.ipcacheLookup(p.Src)
			if localSrc != 0 {
				remoteID = localSrc
			}
		}
		ret := decide(&ep.Policy[polDir(!egress)], remoteID, cidrID, p.Proto, e.PolicyPort)
		e.Flags &^= maps.CTFlagDenied | maps.CTFlagDenyList
		if ret != 0 {
			e.Flags |= maps.CTFlagDenied
			if ret == maps.DropPolicyDenyList {
				e.Flags |= maps.CTFlagDenyList
			}
		}
		e.Checked = m.Now
		m.CT[k] = *e
	}
	if e.Flags&maps.CTFlagDenied == 0 || ep.Audit || e.Flags&maps.CTFlagAudit != 0 {
		return 0
	}
	if e.Flags&maps.CTFlagDenyList != 0 {
		return maps.DropPolicyDenyList
	}
	return maps.DropPolicy
}

// fromContainer is cil_from_container: ep's egress policy, then, for a
// passed packet to another local endpoint whose slot holds a program, that
// endpoint's cil_lxc_policy with ep's identity (the same-node redirect),
// unless it is a reply of a connection that came in through the stack.
func (m *model) fromContainer(ep *modelEndpoint, pkt []byte) verdict {
	v, replyViaStack := m.handle(ep, pkt, true, 0, 0)
	if v.Ret != tcActOK || replyViaStack {
		return v
	}
	if len(pkt) < 14+20 || binary.BigEndian.Uint16(pkt[12:14]) != 0x0800 {
		return v
	}
	lxc, ok := m.LXC[netip.AddrFrom4([4]byte(pkt[14+16:14+20]))]
	if !ok || lxc.ID == ep.ID {
		return v
	}
	dst, ok := m.Slots[lxc.ID]
	if !ok {
		return v // an empty slot: the stack, then the destination's cil_to_container
	}
	return m.lxcPolicy(dst, pkt, ep.Identity)
}

// toContainer is cil_to_container: ep's ingress policy for what reaches
// the pod through the host stack.
func (m *model) toContainer(ep *modelEndpoint, pkt []byte) verdict {
	v, _ := m.handle(ep, pkt, false, 0, maps.CTFlagViaStack)
	return v
}

// lxcPolicy is cil_lxc_policy with skb->cb[0] = srcID: ep's ingress
// policy for a packet from another local endpoint, redirected into the
// pod when it passes. A TTL about to expire, or a packet whose destination
// is not this program's endpoint (a stale slot), goes to the stack
// untouched (TC_ACT_OK).
func (m *model) lxcPolicy(ep *modelEndpoint, pkt []byte, srcID identity.NumericIdentity) verdict {
	if len(pkt) < 14+20 || binary.BigEndian.Uint16(pkt[12:14]) != 0x0800 || pkt[14+8] <= 1 {
		return passed("to the stack")
	}
	lxc, ok := m.LXC[netip.AddrFrom4([4]byte(pkt[14+16:14+20]))]
	if !ok || lxc.ID != ep.ID || lxc.IfIndex != ep.IfIndex {
		return passed("stale slot")
	}
	v, _ := m.handle(ep, pkt, false, srcID, 0)
	if v.Ret == tcActOK {
		v.Ret = tcActRedirect
	}
	return v
}
