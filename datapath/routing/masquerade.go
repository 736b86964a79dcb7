package routing

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"iter"
	"net"
	"os"

	"github.com/cilium/statedb"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/cellium/cellium/statedb/routes"
)

// The agent's nftables objects: one table of its own (family ip), so that
// it never edits a rule someone else made, with one source NAT chain.
const (
	NFTable = "cellium"
	nfChain = "postrouting"
	// masqTag prefixes the user data of each masquerade rule, followed by
	// the source prefix: what Delete and Prune match on.
	masqTag = "cellium-masquerade "
	// exceptTag prefixes the user data of each exception rule (a
	// destination never masqueraded), followed by the prefix.
	exceptTag = "cellium-masquerade-except "
)

// tag is the user data of m's rule.
func tag(m *routes.Masquerade) string {
	if m.Except {
		return exceptTag + m.Prefix.Masked().String()
	}
	return masqTag + m.Prefix.Masked().String()
}

// exceptRule is `ip daddr PREFIX return`: the destination is never
// masqueraded. Exception rules go to the head of the chain.
func exceptRule(m *routes.Masquerade) *nftables.Rule {
	t, ch := nfObjects()
	p := m.Prefix.Masked()
	addr := p.Addr().As4()
	return &nftables.Rule{
		Table: t, Chain: ch, UserData: []byte(tag(m)),
		Exprs: []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: net.CIDRMask(p.Bits(), 32), Xor: []byte{0, 0, 0, 0}},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: addr[:]},
			&expr.Verdict{Kind: expr.VerdictReturn},
		},
	}
}

// MasqueradeOps reconciles the masquerade table into nftables: per row,
// in table ip cellium, chain postrouting (nat, srcnat priority):
// `ip saddr PREFIX ip daddr != PREFIX oifname != EXCEPT masquerade`.
type MasqueradeOps struct{ Netns Netns }

func (o MasqueradeOps) conn(f func(c *nftables.Conn) error) error {
	nsf, err := os.Open(o.Netns.path())
	if err != nil {
		return fmt.Errorf("open netns %s: %w", o.Netns.path(), err)
	}
	defer nsf.Close()
	c, err := nftables.New(nftables.WithNetNSFd(int(nsf.Fd())))
	if err != nil {
		return fmt.Errorf("nftables in %s: %w", o.Netns.path(), err)
	}
	return f(c)
}

func nfObjects() (*nftables.Table, *nftables.Chain) {
	t := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: NFTable}
	return t, &nftables.Chain{
		Name: nfChain, Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource,
	}
}

// rules lists the chain's rules; a missing table or chain has none.
func rules(c *nftables.Conn) ([]*nftables.Rule, error) {
	t, ch := nfObjects()
	rs, err := c.GetRules(t, ch)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	return rs, err
}

func masqRule(m *routes.Masquerade) *nftables.Rule {
	t, ch := nfObjects()
	p := m.Prefix.Masked()
	addr := p.Addr().As4()
	mask := net.CIDRMask(p.Bits(), 32)
	ifname := make([]byte, 16)
	copy(ifname, m.ExceptDevice)
	zero := []byte{0, 0, 0, 0}
	return &nftables.Rule{
		Table: t, Chain: ch, UserData: []byte(masqTag + p.String()),
		Exprs: []expr.Any{
			// ip saddr PREFIX
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: zero},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: addr[:]},
			// ip daddr != PREFIX
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: zero},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: addr[:]},
			// oifname != EXCEPT
			&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: ifname},
			&expr.Masq{},
		},
	}
}

// Update implements reconciler.Operations: it creates the table and chain
// if needed and the rule of m unless it is there.
func (o MasqueradeOps) Update(_ context.Context, _ statedb.ReadTxn, m *routes.Masquerade) error {
	err := o.conn(func(c *nftables.Conn) error {
		t, ch := nfObjects()
		c.AddTable(t)
		c.AddChain(ch)
		if err := c.Flush(); err != nil {
			return fmt.Errorf("create table %s: %w", NFTable, err)
		}
		rs, err := rules(c)
		if err != nil {
			return fmt.Errorf("list rules: %w", err)
		}
		want := masqRule(m)
		if m.Except {
			want = exceptRule(m)
		}
		for _, r := range rs {
			if bytes.Equal(r.UserData, want.UserData) {
				return nil
			}
		}
		if m.Except {
			c.InsertRule(want) // at the head: before every masquerade rule
		} else {
			c.AddRule(want)
		}
		return c.Flush()
	})
	if err != nil {
		return fmt.Errorf("masquerade %s: %w", m.Prefix, err)
	}
	return nil
}

// Delete implements reconciler.Operations: it removes the rule of m.
func (o MasqueradeOps) Delete(_ context.Context, _ statedb.ReadTxn, m *routes.Masquerade) error {
	t := []byte(tag(m))
	err := o.deleteRules(func(ud []byte) bool { return bytes.Equal(ud, t) })
	if err != nil {
		return fmt.Errorf("delete masquerade %s: %w", m.Prefix, err)
	}
	return nil
}

// Prune implements reconciler.Operations: it removes the agent's
// masquerade rules that are not desired.
func (o MasqueradeOps) Prune(_ context.Context, _ statedb.ReadTxn, desired iter.Seq2[*routes.Masquerade, statedb.Revision]) error {
	keep := map[string]bool{}
	for m := range desired {
		keep[tag(m)] = true
	}
	return o.deleteRules(func(ud []byte) bool { return !keep[string(ud)] })
}

func (o MasqueradeOps) deleteRules(match func(userData []byte) bool) error {
	return o.conn(func(c *nftables.Conn) error {
		rs, err := rules(c)
		if err != nil {
			return fmt.Errorf("list rules: %w", err)
		}
		n := 0
		for _, r := range rs {
			if !match(r.UserData) {
				continue
			}
			if err := c.DelRule(r); err != nil {
				return err
			}
			n++
		}
		if n == 0 {
			return nil
		}
		return c.Flush()
	})
}

// RemoveNFTable deletes the agent's nftables table in n, if there is one
// (devcluster down, uninstall).
func RemoveNFTable(n Netns) error {
	return MasqueradeOps{Netns: n}.conn(func(c *nftables.Conn) error {
		ts, err := c.ListTablesOfFamily(nftables.TableFamilyIPv4)
		if err != nil {
			return err
		}
		for _, t := range ts {
			if t.Name == NFTable {
				c.DelTable(t)
				return c.Flush()
			}
		}
		return nil
	})
}
