package bpf_test

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/cellium/cellium/datapath/bpf"
	"github.com/cellium/cellium/datapath/lbsync"
	"github.com/cellium/cellium/datapath/loader"
	"github.com/cellium/cellium/datapath/maglev"
	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/statedb/lb"
	"github.com/cellium/cellium/test/privileged"
)

// The Maglev test's table size and seed (a small table keeps the test
// fast; the program does not depend on M).
const (
	mgTableSize = 251
	mgSeed      = "AAECAwQFBgcICQoL"
	mgPort      = 30090 // frontend node 1:30090/TCP
	mgAffPort   = 30091 // the same backends with session affinity
	mgFlows     = 64
)

// TestPrivilegedNodePortMaglev checks --bpf-lb-algorithm=maglev in
// cil_from_netdev: node 1's NodePort has four backends (pods l and r,
// ports 8080 and 8081) and a Maglev table written as the agent writes it
// (lbsync's Maglev into cellium_lb4_maglev). Connections from 64 client
// ports each land on the backend of their 5-tuple's slot in the table
// (the test hashes as the program does), which spreads them over all four;
// the same 5-tuple after the NAT state is flushed lands on the same
// backend again; with one backend removed (its table swapped), the flows
// of the other backends stay where they were but for Maglev's small
// disruption. With session affinity the client's backend still wins over
// the table. With random selection (the program's constant 0) the
// predicted backends are right only by chance and the test fails.
func TestPrivilegedNodePortMaglev(t *testing.T) {
	privileged.Require(t)
	tp := newNPTopology(t, false)
	tp.l.serveWhoami(t, npBackendPort+1)
	tp.r.serveWhoami(t, npBackendPort+1)
	all := []lb.L4Addr{
		{Addr: npLocalIP, Port: npBackendPort, Proto: syscall.IPPROTO_TCP},     // ID 1 (newNPTopology)
		{Addr: npRemote, Port: npBackendPort, Proto: syscall.IPPROTO_TCP},      // ID 2
		{Addr: npLocalIP, Port: npBackendPort + 1, Proto: syscall.IPPROTO_TCP}, // ID 3
		{Addr: npRemote, Port: npBackendPort + 1, Proto: syscall.IPPROTO_TCP},  // ID 4
	}
	if err := tp.lb.Backends.Update([]uint32{3, 4}, all[2:]); err != nil {
		t.Fatal(err)
	}
	seed, err := maglev.ParseSeed(mgSeed)
	if err != nil {
		t.Fatal(err)
	}
	np := &loader.NodePort{Layout: loader.Layout{Root: tp.n1.root}, Netns: loader.Netns{Path: tp.n1.ns.Path()},
		MaglevTableSize: mgTableSize, MaglevSeed: seed.Datapath()}
	if err := np.Ensure([]string{"eth0"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := np.Remove(); err != nil {
			t.Error(err)
		}
	})
	mm, err := maps.OpenMaglev(tp.n1.dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mm.Close() })
	mg := lbsync.Maglev{Map: mm, TableSize: mgTableSize, Seed: seed}
	fe := lb.L4Addr{Addr: tp.n1.ip, Port: mgPort, Proto: syscall.IPPROTO_TCP}
	front := &lb.Frontend{Address: fe, Type: lb.TypeNodePort, Backends: all, BackendIDs: []uint32{1, 2, 3, 4}}
	table := mg.Table(front)
	if err := mm.Swap(fe, table); err != nil {
		t.Fatal(err)
	}
	tp.service(t, mgPort, syscall.IPPROTO_TCP, svcNodePort, 1, 2, 3, 4)

	// predict is the backend ID the program must pick for client port p.
	predict := func(table []uint32, port, p uint16) uint32 {
		return table[maglevHash(outsideIP, tp.n1.ip, p, port, syscall.IPPROTO_TCP, seed.Datapath())%mgTableSize]
	}
	round := func(t *testing.T, table []uint32) map[uint16]uint32 {
		t.Helper()
		got := map[uint16]uint32{}
		wrong := 0
		for i := range mgFlows {
			p := uint16(41000 + i)
			id, err := tp.maglevDial(mgPort, p)
			if err != nil {
				t.Fatalf("client port %d: %v", p, err)
			}
			got[p] = id
			if want := predict(table, mgPort, p); id != want {
				wrong++
				if wrong <= 5 {
					t.Errorf("client port %d went to backend %d, its Maglev slot holds %d", p, id, want)
				}
			}
		}
		if wrong > 0 {
			t.Errorf("%d of %d flows not on their Maglev backend", wrong, mgFlows)
		}
		return got
	}

	var first map[uint16]uint32
	t.Run("spread by 5-tuple", func(t *testing.T) {
		first = round(t, table)
		per := map[uint32]int{}
		for _, id := range first {
			per[id]++
		}
		t.Logf("flows per backend: %v", per)
		if len(per) != 4 {
			t.Errorf("%d flows reached %d backends, want all 4: %v", mgFlows, len(per), per)
		}
		for id, n := range per {
			if n > mgFlows/2 {
				t.Errorf("backend %d got %d of %d flows", id, n, mgFlows)
			}
		}
	})
	if first == nil {
		t.FailNow()
	}

	t.Run("same 5-tuple same backend", func(t *testing.T) {
		// round flushes the NAT state before each connection: the
		// program chooses anew, from the table.
		again := round(t, table)
		for p, id := range first {
			if again[p] != id {
				t.Errorf("client port %d: backend %d, then %d", p, id, again[p])
			}
		}
	})

	t.Run("backend removed", func(t *testing.T) {
		front3 := &lb.Frontend{Address: fe, Type: lb.TypeNodePort, Backends: all[:3], BackendIDs: []uint32{1, 2, 3}}
		table3 := mg.Table(front3)
		if err := mm.Swap(fe, table3); err != nil {
			t.Fatal(err)
		}
		tp.service(t, mgPort, syscall.IPPROTO_TCP, svcNodePort, 1, 2, 3)
		after := round(t, table3)
		kept, others := 0, 0
		for p, id := range first {
			if after[p] == 4 {
				t.Errorf("client port %d still went to the removed backend", p)
			}
			if id == 4 {
				continue
			}
			others++
			if after[p] == id {
				kept++
			}
		}
		t.Logf("%d of %d flows of the remaining backends kept their backend", kept, others)
		if kept < others*9/10 {
			t.Errorf("only %d of %d flows of the remaining backends kept their backend", kept, others)
		}
	})

	t.Run("affinity wins", func(t *testing.T) {
		afe := lb.L4Addr{Addr: tp.n1.ip, Port: mgAffPort, Proto: syscall.IPPROTO_TCP}
		if err := mm.Swap(afe, table); err != nil {
			t.Fatal(err)
		}
		if err := tp.lb.AffinityMatch.Update([]maps.AffinityMatch{{Frontend: afe, BackendID: 1}, {Frontend: afe, BackendID: 2},
			{Frontend: afe, BackendID: 3}, {Frontend: afe, BackendID: 4}}); err != nil {
			t.Fatal(err)
		}
		tp.service(t, mgAffPort, syscall.IPPROTO_TCP, svcNodePort|svcAffinity, 1, 2, 3, 4)
		var ids []uint32
		predicted := map[uint32]bool{}
		for i := range 16 {
			p := uint16(42000 + i)
			id, err := tp.maglevDial(mgAffPort, p)
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
			predicted[predict(table, mgAffPort, p)] = true
		}
		for _, id := range ids {
			if id != ids[0] {
				t.Fatalf("with ClientIP affinity the client went to backends %v, want one", ids)
			}
		}
		if len(predicted) < 2 {
			t.Fatalf("the test's client ports all hash to one backend: it shows nothing")
		}
	})
}

// maglevHash is lb4_maglev_hash of bpf/include/maglev.h: the kernel's
// jhash_3words over the addresses and ports as the program loads them
// (network byte order read as little-endian words).
func maglevHash(saddr, daddr netip.Addr, sport, dport uint16, proto uint8, seed uint32) uint32 {
	s4, d4 := saddr.As4(), daddr.As4()
	a := binary.LittleEndian.Uint32(s4[:])
	b := binary.LittleEndian.Uint32(d4[:])
	c := uint32(htons(sport))<<16 | uint32(htons(dport))
	rol := func(x uint32, k uint) uint32 { return x<<k | x>>(32-k) }
	init := (seed ^ uint32(proto)) + 0xdeadbeef + 3<<2
	a, b, c = a+init, b+init, c+init
	c ^= b
	c -= rol(b, 14)
	a ^= c
	a -= rol(c, 11)
	b ^= a
	b -= rol(a, 25)
	c ^= b
	c -= rol(b, 16)
	a ^= c
	a -= rol(c, 4)
	b ^= a
	b -= rol(a, 14)
	c ^= b
	c -= rol(b, 24)
	return c
}

// maglevDial flushes node 1's NAT state (so that the program chooses a
// backend anew), connects from the outside's port sport to node 1's
// port, reads the whoami line and resets the connection (no TIME_WAIT:
// the next round reuses the port). It returns the backend ID the
// program chose, from its connection entry.
func (tp *npTopology) maglevDial(port, sport uint16) (uint32, error) {
	if err := flushMap[bpf.NodeportNodeportCt4Key](tp.n1.m.NodePortCT4); err != nil {
		return 0, err
	}
	if err := flushMap[bpf.NodeportNodeportRev4Key](tp.n1.m.NodePortRev4); err != nil {
		return 0, err
	}
	c, err := tp.dialOutside("tcp4", netip.AddrPortFrom(outsideIP, sport), tp.nodePort(port), 3*time.Second)
	if err != nil {
		return 0, fmt.Errorf("dial from port %d: %w", sport, err)
	}
	defer func() {
		_ = c.(*net.TCPConn).SetLinger(0)
		c.Close()
	}()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
		return 0, fmt.Errorf("read whoami from port %d: %w", sport, err)
	}
	n1, out := tp.n1.ip.As4(), outsideIP.As4()
	key := bpf.NodeportNodeportCt4Key{Client: binary.LittleEndian.Uint32(out[:]), Frontend: binary.LittleEndian.Uint32(n1[:]),
		ClientPort: htons(sport), FrontendPort: htons(port), Proto: syscall.IPPROTO_TCP}
	var e bpf.NodeportNodeportCt4Entry
	if err := tp.n1.m.NodePortCT4.Lookup(&key, &e); err != nil {
		return 0, fmt.Errorf("connection entry of port %d: %w", sport, err)
	}
	return e.BackendId, nil
}

// flushMap deletes every entry of m (keys of type K).
func flushMap[K any](m *ebpf.Map) error {
	var keys []K
	var k K
	it := m.Iterate()
	var v []byte
	for it.Next(&k, &v) {
		keys = append(keys, k)
	}
	if err := it.Err(); err != nil {
		return err
	}
	for i := range keys {
		if err := m.Delete(&keys[i]); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return err
		}
	}
	return nil
}
