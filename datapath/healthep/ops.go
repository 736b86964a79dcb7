package healthep

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"sync"

	"github.com/cilium/statedb"

	"github.com/cellium/cellium/datapath/link"
	"github.com/cellium/cellium/statedb/health"
)

// Errors of Update.
var (
	// ErrClosed is returned once Close was called: the agent is stopping
	// and starts no responder any more.
	ErrClosed = errors.New("health endpoint operations closed")
	// ErrResponderStopped is returned while StopResponder holds the
	// responder stopped.
	ErrResponderStopped = errors.New("health responder stopped on request")
)

// Ops is the reconciler's target for the health-netns table: it makes the
// namespace, the veth and the responder of a row, or adopts and repairs
// them, and records the result in the health-interface table. It holds
// the running responder; Close stops it when the agent stops (the
// namespace and veth stay for the next agent to adopt).
type Ops struct {
	host       link.Host
	db         *statedb.DB
	interfaces statedb.RWTable[*health.Interface]
	log        *slog.Logger

	mu     sync.Mutex
	resp   *responder
	closed bool
	held   bool // StopResponder holds the responder stopped
}

// NewOps returns the operations acting on the node namespace host (the
// zero Host is the caller's), recording into interfaces.
func NewOps(host link.Host, db *statedb.DB, interfaces statedb.RWTable[*health.Interface], log *slog.Logger) *Ops {
	return &Ops{host: host, db: db, interfaces: interfaces, log: log}
}

func spec(n *health.Netns) link.Spec {
	return link.Spec{
		ContainerID: n.ContainerID, NetnsPath: n.NetnsPath, IfName: n.IfName, HostIfName: n.HostIfName,
		IPv4: n.IPv4.AsSlice(), Gateway: n.Gateway.AsSlice(),
	}
}

// Update makes n real: the namespace (adopted if pinned already), the
// veth with the address and routes (kept when CheckEndpoint finds it
// right, else removed and made anew), the responder serving inside this
// very namespace (restarted when it stopped or the namespace was made
// anew), and the health-interface row.
//
// Errors: ErrClosed; namespace, link and listen errors, each naming what
// failed.
func (o *Ops) Update(ctx context.Context, _ statedb.ReadTxn, n *health.Netns) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return ErrClosed
	}
	created, err := ensureNetns(n.NetnsPath)
	if err != nil {
		return fmt.Errorf("health netns: %w", err)
	}
	s := spec(n)
	check := errors.New("namespace just created")
	if !created {
		check = o.host.CheckEndpoint(ctx, s)
	}
	if check != nil {
		if !created {
			o.log.Info("setting up the health endpoint's veth again", "netns", n.NetnsPath, "reason", check)
		}
		// A veth of an earlier namespace (one removed while a responder
		// still held it) is not ours to adopt: remove it first.
		if err := o.host.RemoveEndpoint(ctx, n.HostIfName, ""); err != nil {
			return fmt.Errorf("remove old health veth: %w", err)
		}
		if _, err := o.host.SetupEndpoint(ctx, s); err != nil {
			return fmt.Errorf("health veth: %w", err)
		}
	}
	inode, err := netnsInode(n.NetnsPath)
	if err != nil {
		return err
	}
	if r := o.resp; r != nil && (!r.serving() || r.inode != inode || r.port != n.Port || r.netnsPath != n.NetnsPath) {
		if err := r.stop(); err != nil {
			o.log.Warn("stop health responder", "error", err)
		}
		o.resp = nil
	}
	if o.resp == nil {
		if o.held {
			return ErrResponderStopped
		}
		r, err := startResponder(n.NetnsPath, inode, n.Port)
		if err != nil {
			return fmt.Errorf("health responder: %w", err)
		}
		o.resp = r
	}
	return o.record(n, inode)
}

// record writes the health-interface row of n.
func (o *Ops) record(n *health.Netns, inode uint64) error {
	hostIndex, hostMAC, err := linkAttrs(o.host.NetnsPath, n.HostIfName)
	if err != nil {
		return fmt.Errorf("read health veth: %w", err)
	}
	_, mac, err := linkAttrs(n.NetnsPath, n.IfName)
	if err != nil {
		return fmt.Errorf("read health veth peer: %w", err)
	}
	row := &health.Interface{
		HostIfName: n.HostIfName, HostIfIndex: hostIndex, HostMAC: hostMAC, IfName: n.IfName, MAC: mac,
		NetnsPath: n.NetnsPath, NetnsInode: inode, ContainerID: n.ContainerID, IPv4: n.IPv4,
	}
	wtxn := o.db.WriteTxn(o.interfaces)
	defer wtxn.Abort()
	if cur, _, ok := o.interfaces.Get(wtxn, health.InterfaceIndex.Query(row.HostIfName)); ok && *cur == *row {
		return nil
	}
	for cur := range o.interfaces.All(wtxn) {
		if cur.HostIfName != row.HostIfName {
			if _, _, err := o.interfaces.Delete(wtxn, cur); err != nil {
				return fmt.Errorf("delete health interface %s: %w", cur.HostIfName, err)
			}
		}
	}
	if _, _, err := o.interfaces.Insert(wtxn, row); err != nil {
		return fmt.Errorf("insert health interface %s: %w", row.HostIfName, err)
	}
	wtxn.Commit()
	return nil
}

// Delete stops the responder and removes the veth and the namespace of n,
// and its health-interface row. What is missing already is no error.
func (o *Ops) Delete(ctx context.Context, _ statedb.ReadTxn, n *health.Netns) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.stopLocked()
	wtxn := o.db.WriteTxn(o.interfaces)
	var rowErr error
	if _, _, err := o.interfaces.Delete(wtxn, &health.Interface{HostIfName: n.HostIfName}); err != nil {
		wtxn.Abort()
		rowErr = fmt.Errorf("delete health interface %s: %w", n.HostIfName, err)
	} else {
		wtxn.Commit()
	}
	return errors.Join(rowErr, o.host.RemoveEndpoint(ctx, n.HostIfName, n.NetnsPath), removeNetns(n.NetnsPath))
}

// Prune does nothing: the only namespace Ops makes is the desired one, and
// an agent whose health endpoint is off does not run Ops at all (`make
// down` and Remove clean up after it).
func (o *Ops) Prune(context.Context, statedb.ReadTxn, iter.Seq2[*health.Netns, statedb.Revision]) error {
	return nil
}

// StopResponder stops the responder and keeps it stopped until resume is
// called (Update fails with ErrResponderStopped meanwhile, so the
// health-netns row says why); the reconciler's next Update after resume
// starts it again. It is for tests and fault injection.
func (o *Ops) StopResponder() (resume func()) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.held = true
	o.stopLocked()
	return func() {
		o.mu.Lock()
		defer o.mu.Unlock()
		o.held = false
	}
}

// Close stops the responder for good: Update fails with ErrClosed after.
func (o *Ops) Close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.closed = true
	o.stopLocked()
}

func (o *Ops) stopLocked() {
	if o.resp == nil {
		return
	}
	if err := o.resp.stop(); err != nil {
		o.log.Warn("stop health responder", "error", err)
	}
	o.resp = nil
}

// Remove deletes the health veth and namespace as Update makes them for
// the given names (`make down`, after the agent stopped). Missing ones are
// no error.
func Remove(ctx context.Context, host link.Host, netnsPath, hostIfName string) error {
	return errors.Join(host.RemoveEndpoint(ctx, hostIfName, netnsPath), removeNetns(netnsPath))
}
