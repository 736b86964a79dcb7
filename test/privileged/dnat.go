package privileged

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// DNAT makes the nftables table `ip <table>` in the network namespace at
// netnsPath with one prerouting chain (type nat, priority dstnat) that
// rewrites TCP and UDP to vip to backend, as kube-proxy does for a
// NodePort, an ExternalIP or a ClusterIP and the portmap plugin for a
// hostPort:
//
//	meta l4proto tcp ip daddr VIP tcp dport VPORT dnat to BACKEND:PORT
//	meta l4proto udp ip daddr VIP udp dport VPORT dnat to BACKEND:PORT
//
// The table is the caller's own (table must be a name nobody else uses):
// it is deleted when tb ends, and only it.
func DNAT(tb testing.TB, netnsPath, table string, vip, backend netip.AddrPort) {
	tb.Helper()
	if !vip.Addr().Is4() || !backend.Addr().Is4() {
		tb.Fatalf("DNAT %s -> %s: IPv4 only", vip, backend)
	}
	conn := func(f func(c *nftables.Conn) error) error {
		nsf, err := os.Open(netnsPath)
		if err != nil {
			return fmt.Errorf("open netns %s: %w", netnsPath, err)
		}
		defer nsf.Close()
		c, err := nftables.New(nftables.WithNetNSFd(int(nsf.Fd())))
		if err != nil {
			return fmt.Errorf("nftables in %s: %w", netnsPath, err)
		}
		return f(c)
	}
	t := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: table}
	err := conn(func(c *nftables.Conn) error {
		tables, err := c.ListTablesOfFamily(nftables.TableFamilyIPv4)
		if err != nil {
			return fmt.Errorf("list tables: %w", err)
		}
		for _, have := range tables {
			if have.Name == table {
				return fmt.Errorf("table ip %s exists already", table)
			}
		}
		c.AddTable(t)
		ch := c.AddChain(&nftables.Chain{
			Name: "prerouting", Table: t, Type: nftables.ChainTypeNAT,
			Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest,
		})
		vaddr, baddr := vip.Addr().As4(), backend.Addr().As4()
		vport, bport := binary.BigEndian.AppendUint16(nil, vip.Port()), binary.BigEndian.AppendUint16(nil, backend.Port())
		for _, proto := range []byte{unix.IPPROTO_TCP, unix.IPPROTO_UDP} {
			c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: []expr.Any{
				&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: vaddr[:]},
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: vport},
				&expr.Immediate{Register: 1, Data: baddr[:]},
				&expr.Immediate{Register: 2, Data: bport},
				&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 2, Specified: true},
			}})
		}
		return c.Flush()
	})
	if err != nil {
		tb.Fatalf("DNAT %s -> %s in table ip %s: %v", vip, backend, table, err)
	}
	tb.Cleanup(func() {
		err := conn(func(c *nftables.Conn) error {
			c.DelTable(t)
			return c.Flush()
		})
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			tb.Errorf("remove table ip %s: %v", table, err)
		}
	})
}
