package bpf_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/cellium/cellium/datapath/bpf"
	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/policy"
	"github.com/cellium/cellium/test/privileged"
)

// FuzzDatapath is a differential fuzzer of bpf/lxc.c: its input drives a
// generator of a node (three endpoints with random policies, audit mode,
// CIDR identities, the same-node redirect on or off, a stale slot) and of
// a sequence of packets through the endpoints' programs
// (BPF_PROG_TEST_RUN), each compared, verdict and drop reason, with the
// reference model of model_test.go; at the end the conntrack and fragment
// tables must hold the same entries. bpf/README.md ("The differential fuzzer") says
// how to run it and add a seed; `go test` runs the seeds in
// testdata/fuzz/FuzzDatapath.
func FuzzDatapath(f *testing.F) {
	privileged.Require(f)
	bed := newFuzzBed(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		bed.run(t, data)
	})
}

// The node of the fuzzer: endpoints fuzzEPs, a remote node's pods in
// 10.9.1.0/24 (fuzzRemoteID), world beyond.
var (
	fuzzEPs = []struct {
		id   uint16
		sec  identity.NumericIdentity
		addr netip.Addr
		mac  net.HardwareAddr
	}{
		{31, 3001, netip.MustParseAddr("10.9.0.1"), net.HardwareAddr{2, 0, 0, 0, 0, 0x31}},
		{32, 3002, netip.MustParseAddr("10.9.0.2"), net.HardwareAddr{2, 0, 0, 0, 0, 0x32}},
		{33, 3003, netip.MustParseAddr("10.9.0.3"), net.HardwareAddr{2, 0, 0, 0, 0, 0x33}},
	}
	fuzzRemotePrefix = netip.MustParsePrefix("10.9.1.0/24")
	fuzzRemote       = netip.MustParseAddr("10.9.1.5")
	fuzzRouter       = netip.MustParseAddr("10.9.1.1")
	fuzzWorld        = netip.MustParseAddr("192.0.2.9")
	// fuzzAddrs are the addresses packets are made of.
	fuzzAddrs = []netip.Addr{fuzzEPs[0].addr, fuzzEPs[1].addr, fuzzEPs[2].addr, fuzzRemote, fuzzRouter, fuzzWorld}
)

const (
	fuzzRemoteID identity.NumericIdentity = 3010
	fuzzCIDRID   identity.NumericIdentity = 1<<24 | 5
	// fuzzStaleIfIndex is the ifindex of endpoint 3's cellium_lxc entry
	// when the input makes its slot stale.
	fuzzStaleIfIndex = 99
	// fuzzMaxOps bounds the packets and events of one input.
	fuzzMaxOps = 64
	// fuzzTimeMargin: a packet that comes this close to a conntrack
	// entry's re-check or expiry time (on the clock of the model, which
	// lags the kernel's by the time a run takes) ends the input, whose
	// verdict would depend on the scheduler.
	fuzzTimeMargin = 200_000_000
)

// fuzzBed is the node in the kernel: one set of maps, and per endpoint
// its programs with and without audit mode (the input picks; both share
// the endpoint's ID, so the same conntrack entries).
type fuzzBed struct {
	m      *maps.Maps
	events *eventReader
	pol    []*maps.PolicyMap
	progs  [][2]*ebpf.Collection // [endpoint][audit]
	// sctpPorts is the model's SCTPPorts (on: lxc.c reads SCTP's ports).
	sctpPorts bool
	// seen counts verdicts by hook and reason ("from 133"), for
	// judging what the generator reaches.
	seen map[string]int
}

func newFuzzBed(tb testing.TB) *fuzzBed {
	tb.Helper()
	m, dir := openMaps(tb)
	b := &fuzzBed{m: m, events: newEventReader(tb, m), seen: map[string]int{}, sctpPorts: true}
	for _, ep := range fuzzEPs {
		if err := m.IPCache.Update(netip.PrefixFrom(ep.addr, 32), maps.IPCacheEntry{Identity: ep.sec}); err != nil {
			tb.Fatal(err)
		}
		pm := openPolicy(tb, dir, ep.id)
		b.pol = append(b.pol, pm)
		var pair [2]*ebpf.Collection
		for i, audit := range []bool{false, true} {
			pair[i] = loadEndpoint(tb, m, pm, endpointConfig{ID: ep.id, Identity: ep.sec, IfIndex: uint32(ep.id), MAC: ep.mac, IPv4: ep.addr, Audit: audit})
		}
		b.progs = append(b.progs, pair)
	}
	if err := m.IPCache.Update(fuzzRemotePrefix, maps.IPCacheEntry{Identity: fuzzRemoteID}); err != nil {
		tb.Fatal(err)
	}
	return b
}

// fuzzInput hands out the input's bytes; past its end, zeros.
type fuzzInput struct{ b []byte }

func (in *fuzzInput) empty() bool { return len(in.b) == 0 }

func (in *fuzzInput) next() byte {
	if len(in.b) == 0 {
		return 0
	}
	c := in.b[0]
	in.b = in.b[1:]
	return c
}

// hook is the program a packet goes through.
type hook uint8

const (
	hookFrom hook = iota // cil_from_container of the sender
	hookTo               // cil_to_container of the receiver
	hookLXC              // cil_lxc_policy of the receiver, skb->cb[0] set
	hookPath             // the sender's cil_from_container, then the receiver's cil_to_container
)

func (h hook) String() string {
	return [...]string{"from", "to", "lxc", "path"}[h]
}

// flow is a packet the generator made, kept for replies, repeats and ICMP
// errors about it.
type flow struct {
	hook         hook
	ep           int // the endpoint whose hook it went through (the sender's for hookPath)
	src, dst     netip.Addr
	proto        uint8
	sport, dport uint16 // ICMP: the echo id in sport
	icmpType     uint8
	frame        []byte
}

// fuzzRun is one input's run: the model, and a log for the report.
type fuzzRun struct {
	bed     *fuzzBed
	t       *testing.T
	in      *fuzzInput
	m       *model
	eps     []*modelEndpoint
	flows   []flow
	log     []string
	lastRet uint32 // the kernel's verdict on the last packet
}

func (b *fuzzBed) run(t *testing.T, data []byte) {
	r := &fuzzRun{bed: b, t: t, in: &fuzzInput{b: data}}
	r.setup()
	for n := 0; n < fuzzMaxOps && !r.in.empty(); n++ {
		if !r.op() {
			return
		}
	}
	r.compareCT()
	r.compareFrags()
	if os.Getenv(fuzzTraceEnv) == "1" {
		t.Logf("steps:\n  %s", strings.Join(r.log, "\n  "))
	}
}

// fuzzTraceEnv=1 logs every input's steps: the node, the packets and both
// verdicts (go test -v -run FuzzDatapath/<seed>), for writing seeds.
const fuzzTraceEnv = "CELLIUM_FUZZ_TRACE"

// fail reports a disagreement with the steps that led to it.
func (r *fuzzRun) fail(format string, args ...any) {
	r.t.Helper()
	r.t.Fatalf("%s\nsteps:\n  %s", fmt.Sprintf(format, args...), strings.Join(r.log, "\n  "))
}

func (r *fuzzRun) logf(format string, args ...any) {
	r.log = append(r.log, fmt.Sprintf(format, args...))
}

// setup reads the node from the input: a byte of flags (1: redirect
// slots; 2: a stale slot for endpoint 3; 4, 8, 16 with 0x80: audit mode
// of endpoint 1, 2, 3; 0x20, 0x40: a CIDR identity on endpoint 2's address,
// on the remote prefix), then each endpoint's policy; it resets the
// kernel's maps to match.
func (r *fuzzRun) setup() {
	t, b := r.t, r.bed
	flags := r.in.next()
	redirect, stale := flags&1 != 0, flags&2 != 0
	r.m = &model{
		Endpoints: map[uint16]*modelEndpoint{},
		LXC:       map[netip.Addr]modelLXC{},
		Slots:     map[uint16]*modelEndpoint{},
		CT:        map[maps.CTKey]maps.CTEntry{},
		Frags:     map[modelFragID]modelFragPorts{},
		SCTPPorts: b.sctpPorts,
	}
	r.logf("setup: redirect %v, endpoint 33's slot stale %v, flags %#x", redirect, stale, flags)
	for i, e := range fuzzEPs {
		ep := &modelEndpoint{ID: e.id, Identity: e.sec, IfIndex: uint32(e.id), MAC: e.mac, Addr: e.addr, Audit: flags&0x80 != 0 && flags&(4<<i) != 0}
		r.eps = append(r.eps, ep)
		r.m.Endpoints[e.id] = ep
		lxc := modelLXC{ID: e.id, IfIndex: uint32(e.id)}
		if i == 2 && stale {
			lxc.IfIndex = fuzzStaleIfIndex
		}
		r.m.LXC[e.addr] = lxc
		if err := b.m.Endpoints.Update(e.addr, maps.EndpointInfo{IfIndex: lxc.IfIndex, ID: e.id, MAC: e.mac, NodeMAC: e.mac, Identity: e.sec}); err != nil {
			t.Fatal(err)
		}
		if redirect {
			r.m.Slots[e.id] = ep
			if err := b.m.PolicyProgs.Set(e.id, b.prog(ep, bpf.LxcProgCilLxcPolicy)); err != nil {
				t.Fatal(err)
			}
		} else if err := b.m.PolicyProgs.Delete(e.id); err != nil {
			t.Fatal(err)
		}
		r.m.IPCache = append(r.m.IPCache, modelPrefix{netip.PrefixFrom(e.addr, 32), maps.IPCacheEntry{Identity: e.sec}})
	}
	r.m.IPCache = append(r.m.IPCache, modelPrefix{fuzzRemotePrefix, maps.IPCacheEntry{Identity: fuzzRemoteID}})
	if flags&0x20 != 0 {
		r.m.IPCache[1].Entry.CIDRIdentity = fuzzCIDRID
	}
	if flags&0x40 != 0 {
		r.m.IPCache[3].Entry.CIDRIdentity = fuzzCIDRID
	}
	for _, p := range r.m.IPCache {
		if err := b.m.IPCache.Update(p.Prefix, p.Entry); err != nil {
			t.Fatal(err)
		}
	}
	for i := range r.eps {
		r.setPolicy(i)
	}
	clearCT(t, b.m)
	b.clearFrags(t)
	b.events.drain(t)
}

// prog is ep's program name, in the variant of its audit mode.
func (b *fuzzBed) prog(ep *modelEndpoint, name string) *ebpf.Program {
	audit := 0
	if ep.Audit {
		audit = 1
	}
	return b.progs[ep.ID-fuzzEPs[0].id][audit].Programs[name]
}

func (b *fuzzBed) clearFrags(tb testing.TB) {
	tb.Helper()
	var k bpf.LxcIpv4FragId
	var v bpf.LxcIpv4FragL4ports
	var keys []bpf.LxcIpv4FragId
	it := b.m.Frags.Iterate()
	for it.Next(&k, &v) {
		keys = append(keys, k)
	}
	if err := it.Err(); err != nil {
		tb.Fatal(err)
	}
	for _, k := range keys {
		if err := b.m.Frags.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			tb.Fatal(err)
		}
	}
}

// setPolicy reads endpoint i's policy from the input and makes it the
// whole of its policy map: a count, then three bytes per entry (identity,
// direction and deny; protocol and port prefix length; port or ICMP
// type).
func (r *fuzzRun) setPolicy(i int) {
	n := int(r.in.next() % 8)
	byKey := map[policy.Key]policy.Entry{}
	for range n {
		b1, b2, b3 := r.in.next(), r.in.next(), r.in.next()
		id := []identity.NumericIdentity{0, 3001, 3002, 3003, fuzzRemoteID, identity.ReservedIdentityWorld, fuzzCIDRID, 0}[b1&7]
		dir := policy.Direction(b1 >> 3 & 1)
		deny := b1>>4&3 == 3
		proto := []uint8{policy.ProtoAny, policy.ProtoTCP, policy.ProtoUDP, policy.ProtoICMP, policy.ProtoTCP, policy.ProtoUDP, policy.ProtoSCTP, policy.ProtoAny}[b2&7]
		plen := []uint8{16, 0, 8, 12}[b2>>3&3]
		port := []uint16{53, 80, 443, 1024, 8080, 40000, 40001, 0, 1000, 65535, 53, 80, 443, 40000, 4096, 8}[b3&15]
		if proto == policy.ProtoICMP {
			port = []uint16{8, 0, 3, 11, 12, 13, 5, 8}[b3&7]
		}
		k := policy.NewKey(id, dir, proto, port, plen)
		byKey[k] = policy.Entry{Key: k, Deny: deny}
	}
	entries := make([]policy.Entry, 0, len(byKey))
	for _, e := range byKey {
		entries = append(entries, e)
	}
	slices.SortFunc(entries, func(a, b policy.Entry) int { return a.Key.Compare(b.Key) })
	ep := r.eps[i]
	ep.Policy = [2]policy.DirectionPolicy{{Enforcing: true}, {Enforcing: true}}
	for _, e := range entries {
		dp := &ep.Policy[e.Direction]
		dp.Entries = append(dp.Entries, e)
	}
	setPolicy(r.t, r.bed.pol[i], entries...)
	r.logf("policy of endpoint %d (audit %v): %v", ep.ID, ep.Audit, entries)
}

// op reads and performs one step; false ends the input early.
func (r *fuzzRun) op() bool {
	switch kind := r.in.next() % 16; kind {
	case 0, 1, 2, 3:
		return r.fresh()
	case 4, 5:
		return r.reply()
	case 6:
		return r.repeat()
	case 7, 8:
		return r.icmpError()
	case 9:
		return r.fragments()
	case 10:
		return r.malformed()
	case 11:
		return r.nonIPv4()
	case 12:
		r.age()
	case 13:
		if b := r.in.next(); b&0x80 != 0 {
			r.changeIPCache(b)
		} else {
			r.expire(b)
		}
	case 14:
		i := int(r.in.next()) % len(r.eps)
		r.setPolicy(i)
	case 15:
		r.toggleAudit()
	default:
		return r.fresh()
	}
	return true
}

// Packets.

// ipFrame is an Ethernet frame with an IPv4 datagram of l4 (tot_len
// covering it) and optLen bytes of IP options (NOPs).
func ipFrame(srcMAC net.HardwareAddr, src, dst netip.Addr, proto uint8, id, frag uint16, optLen int, l4 []byte) []byte {
	hl := 20 + optLen
	b := make([]byte, 14+hl, 14+hl+len(l4))
	copy(b[0:6], []byte{2, 0, 0, 0, 0, 0xfe})
	copy(b[6:12], srcMAC)
	binary.BigEndian.PutUint16(b[12:], 0x0800)
	ip := b[14:]
	ip[0] = 0x40 | uint8(hl/4)
	binary.BigEndian.PutUint16(ip[2:], uint16(hl+len(l4)))
	binary.BigEndian.PutUint16(ip[4:], id)
	binary.BigEndian.PutUint16(ip[6:], frag)
	ip[8] = 64
	ip[9] = proto
	s, d := src.As4(), dst.As4()
	copy(ip[12:16], s[:])
	copy(ip[16:20], d[:])
	for i := 20; i < hl; i++ {
		ip[i] = 1 // NOP
	}
	return append(b, l4...)
}

// l4Header is the L4 header (and a little payload) of a flow's packet:
// TCP with flags and optWords words of options, UDP, SCTP's common
// header, ICMP (an echo's id in sport), or payload alone for other
// protocols.
func l4Header(proto uint8, sport, dport uint16, tcpFlags, icmpType uint8, optWords int) []byte {
	switch proto {
	case ipProtoTCP:
		h := make([]byte, 20+4*optWords+8)
		binary.BigEndian.PutUint16(h[0:], sport)
		binary.BigEndian.PutUint16(h[2:], dport)
		h[12] = uint8(5+optWords) << 4
		h[13] = tcpFlags
		for i := 20; i < 20+4*optWords; i++ {
			h[i] = 1
		}
		return h
	case ipProtoUDP:
		h := make([]byte, 8+8)
		binary.BigEndian.PutUint16(h[0:], sport)
		binary.BigEndian.PutUint16(h[2:], dport)
		binary.BigEndian.PutUint16(h[4:], 16)
		return h
	case ipProtoSCTP:
		h := make([]byte, 12+16) // common header, then a chunk
		binary.BigEndian.PutUint16(h[0:], sport)
		binary.BigEndian.PutUint16(h[2:], dport)
		return h
	case ipProtoICMP:
		h := make([]byte, 8+8)
		h[0] = icmpType
		switch icmpType {
		case icmpEcho:
			binary.BigEndian.PutUint16(h[4:], sport)
		case icmpEchoReply:
			binary.BigEndian.PutUint16(h[4:], dport)
		}
		return h
	}
	return make([]byte, 16)
}

// owner is the index of the endpoint with address a, or -1.
func (r *fuzzRun) owner(a netip.Addr) int {
	for i, ep := range r.eps {
		if ep.Addr == a {
			return i
		}
	}
	return -1
}

// newFlow reads a packet's route and header fields: the hook and its
// endpoint; protocol, a spoofed source or MAC; the peer; ports; TCP flags
// or ICMP type; the IP id.
func (r *fuzzRun) newFlow() (f flow, tcpFlags uint8, mac net.HardwareAddr, cb identity.NumericIdentity) {
	in := r.in
	hb := in.next()
	f.hook, f.ep = hook(hb%4), int(hb/4)%len(r.eps)
	ep := r.eps[f.ep]
	b0, b1 := in.next(), in.next()
	f.proto = []uint8{ipProtoTCP, ipProtoTCP, ipProtoUDP, ipProtoUDP, ipProtoICMP, ipProtoICMP, policy.ProtoSCTP, 47}[b0&7]
	peer := fuzzAddrs[int(b1&15)%len(fuzzAddrs)]
	other := fuzzAddrs[int(b1>>4)%len(fuzzAddrs)]
	spoof := b0>>3&3 == 3
	if f.hook == hookFrom || f.hook == hookPath {
		f.src, f.dst = ep.Addr, peer
		if spoof {
			f.src = other
		}
	} else {
		f.src, f.dst = peer, ep.Addr
		if spoof {
			f.dst = other
		}
	}
	mac = ep.MAC
	if b0>>5 == 7 {
		mac = net.HardwareAddr{2, 0, 0, 0, 0, 0x66}
	}
	ports := []uint16{53, 80, 443, 1024, 8080, 40000, 40001, 40002, 0, 1, 65535, 53, 80, 3, 8, 4096}
	f.sport, f.dport = ports[in.next()&15], ports[in.next()&15]
	fb := in.next()
	tcpFlags = []uint8{tcpSYN, tcpSYN, tcpACK, tcpSYN | tcpACK, tcpFIN | tcpACK, tcpRST, tcpRST | tcpACK, tcpFIN,
		tcpSYN | tcpFIN, 0, 0x18, tcpSYN | 0xc0, 0x30, 0x3f, tcpSYN | tcpRST, tcpACK}[fb&15]
	if fb>>4 == 15 {
		tcpFlags = in.next()
	}
	f.icmpType = []uint8{8, 8, 0, 0, 3, 11, 12, 13, 14, 5, 4, 9, 10, 8, 0, 3}[fb&15]
	if f.proto == ipProtoICMP && f.icmpType == icmpEchoReply {
		f.sport, f.dport = 0, f.sport
	}
	cb = r.cbFor(f.src, hb>>6)
	return f, tcpFlags, mac, cb
}

// cbFor is the skb->cb[0] of a cil_lxc_policy run: the identity of the
// endpoint owning the source (sel 0, 1; its ipcache identity when none),
// another identity (2), or 0 (3).
func (r *fuzzRun) cbFor(src netip.Addr, sel uint8) identity.NumericIdentity {
	switch sel & 3 {
	case 2:
		return []identity.NumericIdentity{3001, 3002, 3003, fuzzRemoteID}[r.in.next()%4]
	case 3:
		return 0
	}
	if i := r.owner(src); i >= 0 {
		return r.eps[i].Identity
	}
	id, _ := r.m.ipcacheLookup(src)
	return id
}

func (r *fuzzRun) fresh() bool {
	f, flags, mac, cb := r.newFlow()
	f.frame = ipFrame(mac, f.src, f.dst, f.proto, uint16(r.in.next()), 0, 0, l4Header(f.proto, f.sport, f.dport, flags, f.icmpType, 0))
	return r.sendFlow(f, cb, "fresh")
}

// sendFlow sends f.frame along f's route and remembers it.
func (r *fuzzRun) sendFlow(f flow, cb identity.NumericIdentity, what string) bool {
	r.flows = append(r.flows, f)
	return r.send(f.hook, f.ep, cb, f.frame, what)
}

// reply answers an earlier packet: its tuple reversed (an echo's reply, a
// TCP SYN-ACK, ACK, FIN-ACK or RST), through the hook that sees it come
// back: into the endpoint that sent it, or out of the one that received
// it; or, when the earlier packet's destination is a local endpoint, out
// of that one.
func (r *fuzzRun) reply() bool {
	if len(r.flows) == 0 {
		return true
	}
	h := r.flows[int(r.in.next())%len(r.flows)]
	b := r.in.next()
	f := flow{proto: h.proto, src: h.dst, dst: h.src, sport: h.dport, dport: h.sport, icmpType: h.icmpType, ep: h.ep}
	switch h.icmpType {
	case icmpEcho:
		f.icmpType = icmpEchoReply
	case icmpEchoReply:
		f.icmpType = icmpEcho
	}
	flags := []uint8{tcpSYN | tcpACK, tcpACK, tcpFIN | tcpACK, tcpRST}[b&3]
	if h.hook == hookFrom || h.hook == hookPath {
		f.hook = hookTo
		if peer := r.owner(h.dst); peer >= 0 && b&4 != 0 {
			f.hook, f.ep = hookFrom, peer
			if b&8 != 0 {
				f.hook = hookPath
			}
		}
	} else {
		f.hook = hookFrom
	}
	f.frame = ipFrame(r.eps[f.ep].MAC, f.src, f.dst, f.proto, uint16(b), 0, 0, l4Header(f.proto, f.sport, f.dport, flags, f.icmpType, int(b>>4&3)))
	return r.sendFlow(f, r.cbFor(f.src, 0), "reply")
}

// repeat sends an earlier packet's tuple again the same way, with any
// TCP flags.
func (r *fuzzRun) repeat() bool {
	if len(r.flows) == 0 {
		return true
	}
	h := r.flows[int(r.in.next())%len(r.flows)]
	flags := r.in.next()
	h.frame = ipFrame(r.eps[h.ep].MAC, h.src, h.dst, h.proto, 0, 0, 0, l4Header(h.proto, h.sport, h.dport, flags, h.icmpType, 0))
	return r.sendFlow(h, r.cbFor(h.src, 0), fmt.Sprintf("repeat (flags %#x)", flags))
}

// icmpError sends an ICMP error (or another type) about an earlier packet
// (or its reverse), from its peer, a router or anyone, back to the
// endpoint that sent it or out of the one that received it; the quote may
// be cut short or its header broken.
func (r *fuzzRun) icmpError() bool {
	if len(r.flows) == 0 {
		return true
	}
	h := r.flows[int(r.in.next())%len(r.flows)]
	b2, b3 := r.in.next(), r.in.next()
	typ := []uint8{icmpDestUnreach, icmpTimeExceeded, icmpParamProblem, icmpDestUnreach, 5, icmpDestUnreach, icmpTimeExceeded, icmpEchoReply}[b2&7]
	quoted := h.frame
	if len(quoted) < 34 || b3&1 != 0 {
		quoted = ipFrame(h.frame[6:12], h.dst, h.src, h.proto, 0, 0, 0, l4Header(h.proto, h.dport, h.sport, tcpACK, h.icmpType, 0))
	}
	ihl := int(quoted[14]&0x0f) * 4
	q := slices.Clone(quoted[14:min(len(quoted), 14+ihl+8)])
	switch b3 >> 3 & 7 {
	case 1:
		q = q[:min(len(q), int(b3>>6)*8+4)] // cut short
	case 2:
		q[0] = 0x4f // a quoted header longer than the quote
	case 3:
		q[0] = 0x44
	}
	msg := append([]byte{typ, b2 >> 3, 0, 0, 0, 0, 0, 0}, q...)
	f := flow{ep: h.ep, proto: ipProtoICMP, icmpType: typ}
	var mac net.HardwareAddr
	if h.hook == hookFrom || h.hook == hookPath {
		// Back into the endpoint that sent it.
		f.hook, f.dst = hookTo, h.src
		f.src = []netip.Addr{h.dst, fuzzRouter, fuzzWorld, fuzzAddrs[int(b3>>6)%len(fuzzAddrs)]}[b3>>1&3]
		mac = net.HardwareAddr{2, 0, 0, 0, 0, 0xfe}
		if b3&0x80 != 0 && r.owner(f.src) >= 0 {
			f.hook = hookLXC
		}
	} else {
		// Out of the endpoint that received it, to its sender.
		f.hook, f.src, f.dst = hookFrom, r.eps[h.ep].Addr, h.src
		mac = r.eps[h.ep].MAC
	}
	f.frame = ipFrame(mac, f.src, f.dst, ipProtoICMP, uint16(b2), 0, 0, msg)
	return r.sendFlow(f, r.cbFor(f.src, 0), fmt.Sprintf("ICMP type %d about %s %s:%d -> %s:%d", typ, h.hook, h.src, h.sport, h.dst, h.dport))
}

// fragments sends a datagram in two fragments, in order, reversed, one of
// them only, or a later fragment with another id (whose first never
// came).
func (r *fuzzRun) fragments() bool {
	pattern, id := r.in.next(), uint16(r.in.next())
	f, flags, mac, cb := r.newFlow()
	l4 := l4Header(f.proto, f.sport, f.dport, flags, f.icmpType, 0)
	l4 = append(l4, make([]byte, 24)...)
	first := ipFrame(mac, f.src, f.dst, f.proto, id, 0x2000, 0, l4[:24])
	later := ipFrame(mac, f.src, f.dst, f.proto, id, 3, 0, l4[24:])
	if pattern&4 != 0 {
		later = ipFrame(mac, f.src, f.dst, f.proto, id+1, 3, 0, l4[24:])
	}
	var seq [][]byte
	switch pattern & 3 {
	case 0:
		seq = [][]byte{first}
	case 1:
		seq = [][]byte{first, later}
	case 2:
		seq = [][]byte{later, first, later}
	case 3:
		seq = [][]byte{later}
	}
	for i, frame := range seq {
		f.frame = frame
		if !r.sendFlow(f, cb, fmt.Sprintf("fragment %d of %d (pattern %#x)", i+1, len(seq), pattern)) {
			return false
		}
	}
	return true
}

// malformed sends a packet with one header broken: version, IHL (short,
// long, with options), tot_len, TCP data offset (or options), a frame
// cut short, padding after the datagram, TTL, a flipped byte, the
// fragment field.
func (r *fuzzRun) malformed() bool {
	mut, x := r.in.next(), r.in.next()
	f, flags, mac, cb := r.newFlow()
	opt := 0
	if mut%12 == 2 {
		opt = int(x%11) * 4
	}
	tcpOpts := 0
	if mut%12 == 5 && x&0x80 != 0 {
		tcpOpts = int(x % 11)
	}
	frame := ipFrame(mac, f.src, f.dst, f.proto, 0, 0, opt, l4Header(f.proto, f.sport, f.dport, flags, f.icmpType, tcpOpts))
	ip := frame[14:]
	ihl := int(ip[0]&0x0f) * 4
	switch mut % 12 {
	case 0:
		ip[0] = x&0xf0 | ip[0]&0x0f
	case 1:
		ip[0] = 0x40 | x%5
	case 2:
		if x&0x80 != 0 {
			ip[0] = 0x40 | (5 + x%11) // claims more options than it has
		}
	case 3:
		binary.BigEndian.PutUint16(ip[2:], uint16(int(x)%(len(ip)+1)))
	case 4:
		binary.BigEndian.PutUint16(ip[2:], uint16(len(ip)+1+int(x)))
	case 5:
		if x&0x80 == 0 && f.proto == ipProtoTCP {
			ip[ihl+12] = x << 4
		}
	case 6:
		frame = frame[:14+int(x)%(len(frame)-14)]
	case 7:
		frame = append(frame, make([]byte, x%40)...)
	case 8:
		ip[8] = x % 3
	case 9:
		frame[int(x)%len(frame)] = mut
	case 10:
		binary.BigEndian.PutUint16(ip[6:], uint16(x)<<8|uint16(mut))
	case 11:
		ip[9] = x
	}
	f.frame = frame
	return r.sendFlow(f, cb, fmt.Sprintf("malformed (%d, %#x)", mut%12, x))
}

// nonIPv4 sends ARP (the endpoint's own sender addresses or others, a
// wrong hardware or protocol type), IPv6, another EtherType, or a frame
// too short for IPv4.
func (r *fuzzRun) nonIPv4() bool {
	b, x := r.in.next(), r.in.next()
	h := []hook{hookFrom, hookTo, hookLXC, hookFrom}[b&3]
	i := int(b>>2) % len(r.eps)
	ep := r.eps[i]
	var frame []byte
	switch b >> 4 & 3 {
	case 0:
		mac, addr := ep.MAC, ep.Addr
		if x&1 != 0 {
			mac = net.HardwareAddr{2, 0, 0, 0, 0, 0x66}
		}
		if x&2 != 0 {
			addr = fuzzAddrs[int(x>>4)%len(fuzzAddrs)]
		}
		frame = arpPacket(mac, addr)
		if x&4 != 0 {
			copy(frame[6:12], ep.MAC) // only the ARP sender is forged
		}
		if x&8 != 0 {
			frame[14+x>>4%6] ^= 0x10
		}
		if x&0x80 != 0 {
			frame = frame[:14+int(x)%28]
		}
	case 1:
		frame = make([]byte, 14+40+20)
		binary.BigEndian.PutUint16(frame[12:], 0x86dd)
		frame[14] = 0x60
		binary.BigEndian.PutUint16(frame[14+4:], 20)
		frame[14+6] = []uint8{6, 17, 58, 4}[x&3]
	case 2:
		frame = make([]byte, 14+46)
		binary.BigEndian.PutUint16(frame[12:], []uint16{0x8100, 0x88cc, 0, 0xffff, 0x0801, 0x8035, 0x88a8, 0x0800 ^ uint16(x)}[x&7])
	case 3:
		frame = ipFrame(ep.MAC, ep.Addr, fuzzRemote, ipProtoUDP, 0, 0, 0, nil)[:14+int(x)%20]
	}
	if h == hookFrom {
		copy(frame[6:12], ep.MAC)
		if x&0x40 != 0 {
			frame[11] ^= 1
		}
	}
	f := flow{hook: h, ep: i, frame: frame}
	return r.send(f.hook, f.ep, r.cbFor(fuzzRemote, 0), frame, "non-IPv4")
}

// toggleAudit reloads an endpoint with audit mode switched (the other
// collection, same endpoint ID and maps): entries it made keep their
// CT_F_AUDIT.
func (r *fuzzRun) toggleAudit() {
	ep := r.eps[int(r.in.next())%len(r.eps)]
	ep.Audit = !ep.Audit
	r.logf("endpoint %d reloaded with audit mode %v", ep.ID, ep.Audit)
	if _, ok := r.m.Slots[ep.ID]; ok {
		if err := r.bed.m.PolicyProgs.Set(ep.ID, r.bed.prog(ep, bpf.LxcProgCilLxcPolicy)); err != nil {
			r.t.Fatal(err)
		}
	}
}

// age moves every conntrack entry's last policy check 2 s back, in the
// kernel and the model: their next reply re-checks the policy.
func (r *fuzzRun) age() {
	r.logf("age: every entry's last check 2 s back")
	for k, e := range r.m.CT {
		e.Checked -= 2 * nsPerSec
		r.m.CT[k] = e
		ke, err := r.bed.m.CT4.Lookup(k)
		if err != nil {
			r.fail("age %+v: the kernel has no such entry: %v", k, err)
		}
		ke.Checked -= 2 * nsPerSec
		if err := r.bed.m.CT4.Update(k, ke); err != nil {
			r.t.Fatal(err)
		}
	}
}

// changeIPCache gives one of the ipcache's prefixes (b&3: an endpoint's
// /32, the remote /24) another identity, and a CIDR identity or none
// (b>>2): the next packets, and the next re-check of a connection's
// replies, see the new one.
func (r *fuzzRun) changeIPCache(b uint8) {
	p := &r.m.IPCache[int(b&3)]
	p.Entry.Identity = []identity.NumericIdentity{3001, 3002, 3003, fuzzRemoteID, identity.ReservedIdentityWorld, 3004}[int(b>>2&7)%6]
	p.Entry.CIDRIdentity = 0
	if b&0x20 != 0 {
		p.Entry.CIDRIdentity = fuzzCIDRID
	}
	r.logf("ipcache %s: %+v", p.Prefix, p.Entry)
	if err := r.bed.m.IPCache.Update(p.Prefix, p.Entry); err != nil {
		r.t.Fatal(err)
	}
}

// expire ends the lifetime of one conntrack entry (b picks it).
func (r *fuzzRun) expire(b uint8) {
	keys := r.ctKeys()
	if len(keys) == 0 {
		return
	}
	k := keys[int(b)%len(keys)]
	r.logf("expire %+v", k)
	e := r.m.CT[k]
	e.Expires = 0
	r.m.CT[k] = e
	ke, err := r.bed.m.CT4.Lookup(k)
	if err != nil {
		r.fail("expire %+v: the kernel has no such entry: %v", k, err)
	}
	ke.Expires = 0
	if err := r.bed.m.CT4.Update(k, ke); err != nil {
		r.t.Fatal(err)
	}
}

func (r *fuzzRun) ctKeys() []maps.CTKey {
	keys := make([]maps.CTKey, 0, len(r.m.CT))
	for k := range r.m.CT {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b maps.CTKey) int { return strings.Compare(fmt.Sprint(a), fmt.Sprint(b)) })
	return keys
}

// Running and comparing.

// send runs frame through hook h of endpoint i (hookPath: the sender's
// cil_from_container, then, if it passed to the stack and the destination
// is a local endpoint, that one's cil_to_container), in the model and in
// the kernel, and compares. False ends the input (a time too close to
// call).
func (r *fuzzRun) send(h hook, i int, cb identity.NumericIdentity, frame []byte, what string) bool {
	if h != hookPath {
		return r.sendOne(h, i, cb, frame, what)
	}
	if !r.sendOne(hookFrom, i, cb, frame, what) {
		return false
	}
	if len(frame) < 34 || binary.BigEndian.Uint16(frame[12:]) != 0x0800 || r.lastRet != tcActOK {
		return true
	}
	dst := r.owner(netip.AddrFrom4([4]byte(frame[14+16 : 14+20])))
	if dst < 0 || dst == i {
		return true
	}
	return r.sendOne(hookTo, dst, 0, frame, what+" (through the stack)")
}

func (r *fuzzRun) sendOne(h hook, i int, cb identity.NumericIdentity, frame []byte, what string) bool {
	ep := r.eps[i]
	frame = testRunnable(frame)
	now := uint64(monotonicNow(r.t))
	if !r.timeClear(now) {
		r.logf("ending the input: a conntrack entry is too close to a deadline")
		return false
	}
	r.m.Now = now
	var want verdict
	var prog *ebpf.Program
	opts := &ebpf.RunOptions{Data: slices.Clone(frame)}
	switch h {
	case hookFrom:
		want, prog = r.m.fromContainer(ep, frame), r.bed.prog(ep, bpf.LxcProgCilFromContainer)
	case hookTo:
		want, prog = r.m.toContainer(ep, frame), r.bed.prog(ep, bpf.LxcProgCilToContainer)
	case hookLXC:
		want, prog = r.m.lxcPolicy(ep, frame, cb), r.bed.prog(ep, bpf.LxcProgCilLxcPolicy)
		opts.Context = skbCB{CB: [5]uint32{uint32(cb)}}
	}
	ret, err := prog.Run(opts)
	if err != nil {
		r.t.Fatalf("run %s of endpoint %d: %v", h, ep.ID, err)
	}
	got := verdict{Ret: ret}
	for _, e := range r.bed.events.drain(r.t) {
		if e.Type != maps.EventDrop {
			continue
		}
		if got.Reason != 0 {
			r.fail("two drop events for one packet: %d and %+v", got.Reason, e)
		}
		got.Reason, got.Endpoint = e.Reason, e.EndpointID
	}
	r.lastRet = ret
	r.bed.seen[fmt.Sprintf("%s %d/%d %s", h, ret, got.Reason, want.Step)]++
	r.logf("%s %s of %d (cb %d): %x -> model %+v, kernel %+v", what, h, ep.ID, cb, frame, want, got)
	if got != (verdict{Ret: want.Ret, Reason: want.Reason, Endpoint: want.Endpoint}) {
		r.fail("%s through %s of endpoint %d: the program says %+v, the model %+v", what, h, ep.ID, got, want)
	}
	return true
}

// testRunnable pads frame to what BPF_PROG_TEST_RUN accepts: it refuses
// (EINVAL) an IPv4 frame shorter than an IPv4 header, an IPv6 one shorter
// than an IPv6 header. (So the programs' checks for a frame too short for
// IPv4 go unfuzzed.)
func testRunnable(frame []byte) []byte {
	min := 0
	switch binary.BigEndian.Uint16(frame[12:14]) {
	case 0x0800:
		min = 14 + 20
	case 0x86dd:
		min = 14 + 40
	}
	if len(frame) < min {
		frame = append(slices.Clone(frame), make([]byte, min-len(frame))...)
	}
	return frame
}

// timeClear reports whether no conntrack entry's re-check or expiry falls
// within fuzzTimeMargin of now.
func (r *fuzzRun) timeClear(now uint64) bool {
	near := func(a, b uint64) bool {
		d := int64(a - b)
		return d > -fuzzTimeMargin && d < fuzzTimeMargin
	}
	for _, e := range r.m.CT {
		if near(now, e.Checked+modelReplyRecheck) || near(now, e.Expires) {
			return false
		}
	}
	return true
}

// compareCT checks that the kernel's conntrack table holds the model's
// entries, with the same flags, counters, remote identity and policy
// port (not times: the two clocks differ by the runs' durations).
func (r *fuzzRun) compareCT() {
	strip := func(e maps.CTEntry) maps.CTEntry { e.Expires, e.Checked = 0, 0; return e }
	got := map[maps.CTKey]maps.CTEntry{}
	if err := r.bed.m.CT4.Iterate(func(k maps.CTKey, e maps.CTEntry) bool { got[k] = strip(e); return true }); err != nil {
		r.t.Fatal(err)
	}
	for k, e := range r.m.CT {
		if g, ok := got[k]; !ok || g != strip(e) {
			r.fail("conntrack entry %+v: the kernel has %+v (present %v), the model %+v", k, g, ok, strip(e))
		}
		delete(got, k)
	}
	for k, e := range got {
		r.fail("conntrack entry %+v %+v in the kernel only", k, e)
	}
}

// compareFrags checks that the kernel's fragment table holds the
// model's datagrams with the same ports.
func (r *fuzzRun) compareFrags() {
	addr := func(w uint32) netip.Addr {
		var b [4]byte
		binary.LittleEndian.PutUint32(b[:], w) // network order in memory
		return netip.AddrFrom4(b)
	}
	got := map[modelFragID]modelFragPorts{}
	var k bpf.LxcIpv4FragId
	var v bpf.LxcIpv4FragL4ports
	it := r.bed.m.Frags.Iterate()
	for it.Next(&k, &v) {
		id := modelFragID{Src: addr(k.Saddr), Dst: addr(k.Daddr), ID: bits.ReverseBytes16(k.Id), Proto: k.Proto}
		got[id] = modelFragPorts{bits.ReverseBytes16(v.Sport), bits.ReverseBytes16(v.Dport), bits.ReverseBytes16(v.PolicyDport)}
	}
	if err := it.Err(); err != nil {
		r.t.Fatal(err)
	}
	for id, ports := range r.m.Frags {
		if g, ok := got[id]; !ok || g != ports {
			r.fail("fragment table, datagram %+v: the kernel has %+v (present %v), the model %+v", id, g, ok, ports)
		}
		delete(got, id)
	}
	for id, ports := range got {
		r.fail("fragment table: datagram %+v %+v in the kernel only", id, ports)
	}
}

// TestPrivilegedFuzzDatapathSeedsReach runs the seed corpus of
// FuzzDatapath and checks that together the seeds reach every step of the
// model and every drop reason the fuzzer can meet: a change of the
// generator's input layout that made the seeds mean something else
// fails here instead of quietly shrinking what `go test` covers.
func TestPrivilegedFuzzDatapathSeedsReach(t *testing.T) {
	privileged.Require(t)
	bed := newFuzzBed(t)
	files, err := filepath.Glob(filepath.Join("testdata", "fuzz", "FuzzDatapath", "*"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no seeds (%v)", err)
	}
	for _, name := range files {
		data := readSeed(t, name)
		t.Run(filepath.Base(name), func(t *testing.T) { bed.run(t, data) })
	}
	reached := map[string]bool{}
	var all []string
	for k := range bed.seen {
		// "<hook> <ret>/<reason> <step>"
		_, rest, _ := strings.Cut(k, " ")
		verdict, step, _ := strings.Cut(rest, " ")
		reached[step], reached[verdict] = true, true
		all = append(all, k)
	}
	slices.Sort(all)
	for _, want := range []string{
		"arp", "source", "parse", "fragment", "reply", "reply denied", "related", "established",
		"policy", "opens nothing", "new", "new (audit)", "to the stack", "stale slot",
		"0/0", "7/0", "2/130", "2/132", "2/133", "2/134", "2/135", "2/139", "2/175", "2/181",
	} {
		if !reached[want] {
			t.Errorf("no seed reaches %q; reached:\n%s", want, strings.Join(all, "\n"))
		}
	}
}

// TestPrivilegedFuzzDatapathSCTPPorts: a NetworkPolicy port of protocol
// SCTP is enforced. The policy engine writes SCTP keys with ports
// (cells/policy appendPortRange; Kubernetes' "should enforce policy based
// on Ports ... using SCTP" spec). These two inputs found lxc.c looking
// SCTP up with port 0: an allow of SCTP port 80 dropped SCTP to port 80
// (133), a deny of SCTP port 80 beside an allow of all SCTP let it
// through. The model with SCTPPorts (Kubernetes' semantics) must agree.
func TestPrivilegedFuzzDatapathSCTPPorts(t *testing.T) {
	privileged.Require(t)
	bed := newFuzzBed(t)
	for name, data := range map[string][]byte{
		// Endpoint 32 allows world SCTP to port 80; world sends SCTP
		// 40000 -> 80 into it.
		"allow-port": {0, 0, 1, 0x05, 0x06, 0x01, 0, 0x00, 0x05, 0x06, 0x05, 0x05, 0x01, 0x00, 0x01},
		// Endpoint 32 allows world all SCTP but denies port 80; the same
		// packet.
		"deny-port": {0, 0, 2, 0x05, 0x0e, 0x00, 0x35, 0x06, 0x01, 0, 0x00, 0x05, 0x06, 0x05, 0x05, 0x01, 0x00, 0x01},
	} {
		t.Run(name, func(t *testing.T) { bed.run(t, data) })
	}
}

// readSeed decodes a corpus file of one []byte ("go test fuzz v1").
func readSeed(tb testing.TB, name string) []byte {
	tb.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		tb.Fatal(err)
	}
	header, value, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	lit, ok := strings.CutPrefix(value, "[]byte(")
	if header != "go test fuzz v1" || !ok || !strings.HasSuffix(lit, ")") {
		tb.Fatalf("%s: not a corpus file of one []byte", name)
	}
	s, err := strconv.Unquote(strings.TrimSuffix(lit, ")"))
	if err != nil {
		tb.Fatalf("%s: %v", name, err)
	}
	return []byte(s)
}
