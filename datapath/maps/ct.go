package maps

import (
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"

	"github.com/cellium/cellium/datapath/bpf"
	"github.com/cellium/cellium/statedb/identity"
)

// CTDir is the hook whose policy admitted a connection (ct4_key.dir).
type CTDir uint8

// The two conntrack directions.
const (
	// CTIngress: the endpoint accepted the connection (cil_to_container).
	CTIngress CTDir = 0
	// CTEgress: the endpoint opened the connection (cil_from_container).
	CTEgress CTDir = 1
)

// String returns "ingress" or "egress".
func (d CTDir) String() string {
	if d == CTEgress {
		return "egress"
	}
	return "ingress"
}

// Conntrack entry flags (ct_entry.flags).
const (
	CTFlagReplySeen uint16 = 1 << 0 // a reply went the other way
	CTFlagClosing   uint16 = 1 << 1 // TCP FIN or RST seen
	CTFlagSYN       uint16 = 1 << 2 // created by a TCP SYN
	CTFlagAudit     uint16 = 1 << 3 // admitted by audit mode only
	// CTFlagViaStack: the connection's last packet in its own direction
	// reached the endpoint through the host stack (cil_to_container); its
	// replies take the stack too, which reverses a NAT the stack applied.
	CTFlagViaStack uint16 = 1 << 4
	CTFlagTxFIN    uint16 = 1 << 5 // FIN seen in the connection's own direction
	CTFlagRxFIN    uint16 = 1 << 6 // FIN seen in the reply direction
	// CTFlagDenied: the last policy check of the connection's own
	// direction denied it, so its replies drop.
	CTFlagDenied uint16 = 1 << 7
	// CTFlagDenyList: that denial came from a deny rule (181).
	CTFlagDenyList uint16 = 1 << 8
)

// CTKey is an IPv4 connection in the orientation of its first packet, as
// one endpoint's hook admitted it. For ICMP echoes the echo id is SrcPort
// of the request (DstPort 0).
type CTKey struct {
	Src, Dst         netip.Addr
	SrcPort, DstPort uint16
	Proto            uint8
	Dir              CTDir
	// Endpoint is the ID of the endpoint whose programs made the entry:
	// only that endpoint's packets match it.
	Endpoint uint16
}

// CTEntry is the state of a connection.
type CTEntry struct {
	// Expires is the CLOCK_MONOTONIC time (bpf_ktime_get_ns) after which
	// the entry is dead.
	Expires   uint64
	TxPackets uint64 // packets in the direction of the first one
	RxPackets uint64 // replies
	RemoteID  identity.NumericIdentity
	Flags     uint16
	// PolicyPort is the destination port (for ICMP the type) the policy
	// admitted the connection on, which replies are re-checked with.
	PolicyPort uint16
	// Checked is the CLOCK_MONOTONIC time of the last policy check of the
	// connection's own direction.
	Checked uint64
}

// CT4 is cellium_ct4, the IPv4 conntrack table.
type CT4 struct{ m *ebpf.Map }

// Map returns the underlying map.
func (c *CT4) Map() *ebpf.Map { return c.m }

func ct4Key(k CTKey) (bpf.LxcCt4Key, error) {
	s, err := addrBE32(k.Src)
	if err != nil {
		return bpf.LxcCt4Key{}, err
	}
	d, err := addrBE32(k.Dst)
	if err != nil {
		return bpf.LxcCt4Key{}, err
	}
	return bpf.LxcCt4Key{Saddr: s, Daddr: d, Sport: htons(k.SrcPort), Dport: htons(k.DstPort), Proto: k.Proto, Dir: uint8(k.Dir), Endpoint: k.Endpoint}, nil
}

func ctKey(k *bpf.LxcCt4Key) CTKey {
	return CTKey{
		Src: be32Addr(k.Saddr), Dst: be32Addr(k.Daddr),
		SrcPort: ntohs(k.Sport), DstPort: ntohs(k.Dport), Proto: k.Proto, Dir: CTDir(k.Dir),
		Endpoint: k.Endpoint,
	}
}

func ctEntry(v *bpf.LxcCtEntry) CTEntry {
	return CTEntry{Expires: v.Expires, TxPackets: v.TxPackets, RxPackets: v.RxPackets,
		RemoteID: identity.NumericIdentity(v.SrcIdentity), Flags: v.Flags, PolicyPort: ntohs(v.PolicyDport),
		Checked: v.Checked}
}

// Lookup returns the entry of k, or an error wrapping ebpf.ErrKeyNotExist.
func (c *CT4) Lookup(k CTKey) (CTEntry, error) {
	bk, err := ct4Key(k)
	if err != nil {
		return CTEntry{}, err
	}
	var v bpf.LxcCtEntry
	if err := c.m.Lookup(&bk, &v); err != nil {
		return CTEntry{}, fmt.Errorf("look up conntrack: %w", err)
	}
	return ctEntry(&v), nil
}

// Update writes e as the entry of k (for tools and tests that age or plant
// entries; the programs make the real ones).
func (c *CT4) Update(k CTKey, e CTEntry) error {
	bk, err := ct4Key(k)
	if err != nil {
		return err
	}
	v := bpf.LxcCtEntry{Expires: e.Expires, TxPackets: e.TxPackets, RxPackets: e.RxPackets,
		SrcIdentity: uint32(e.RemoteID), Flags: e.Flags, PolicyDport: htons(e.PolicyPort), Checked: e.Checked}
	if err := c.m.Update(&bk, &v, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("update conntrack: %w", err)
	}
	return nil
}

// Delete removes k; a missing entry is not an error.
func (c *CT4) Delete(k CTKey) error {
	bk, err := ct4Key(k)
	if err != nil {
		return err
	}
	return deleteKey(c.m, &bk)
}

// Iterate calls yield for every entry until it returns false.
func (c *CT4) Iterate(yield func(CTKey, CTEntry) bool) error {
	return iterate(c.m, func(k *bpf.LxcCt4Key, v *bpf.LxcCtEntry) bool {
		return yield(ctKey(k), ctEntry(v))
	})
}

// DeleteMatching deletes every entry for which match returns true (for
// example all connections of a deleted endpoint's address, so a new pod
// with the same address inherits none) and returns how many it deleted.
// It lists first, then deletes; entries that vanish meanwhile are fine.
func (c *CT4) DeleteMatching(match func(CTKey, CTEntry) bool) (int, error) {
	var doomed []bpf.LxcCt4Key
	err := iterate(c.m, func(k *bpf.LxcCt4Key, v *bpf.LxcCtEntry) bool {
		if match(ctKey(k), ctEntry(v)) {
			doomed = append(doomed, *k)
		}
		return true
	})
	if err != nil {
		return 0, err
	}
	for i := range doomed {
		if err := deleteKey(c.m, &doomed[i]); err != nil {
			return i, err
		}
	}
	return len(doomed), nil
}
