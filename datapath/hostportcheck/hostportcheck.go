package hostportcheck

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/cilium/statedb"

	"github.com/cellium/cellium/datapath/hostsockets"
	"github.com/cellium/cellium/statedb/lb"
	"github.com/cellium/cellium/statedb/reconciler"
)

// Interval is how often the sockets are listed again while the frontends
// stay the same: a process binding a port is seen within it.
const Interval = 30 * time.Second

// MinInterval is the least time between two listings: the frontends table
// changes with every endpoint and reconciliation.
const MinInterval = time.Second

// Lister lists the host network namespace's sockets
// (*hostsockets.Lister).
type Lister interface {
	// Listening returns the TCP sockets in LISTEN and the bound,
	// unconnected UDP sockets.
	Listening() ([]hostsockets.Socket, error)
	// Processes names the processes holding the sockets of inodes, where
	// it can.
	Processes(inodes []uint32) map[uint32]hostsockets.Process
}

// Notifier is a Lister that knows when its sockets change (the
// control-plane tests' fake host); the Checker then also lists at once.
// The host's Lister does not: it is polled every Interval.
type Notifier interface {
	// Changed returns a channel closed at the next change.
	Changed() <-chan struct{}
}

// Config is what a Checker reads and writes.
type Config struct {
	DB        *statedb.DB
	Frontends statedb.Table[*lb.Frontend]
	// States gets the rows whose owner ends in lb.HostSocketSuffix; the
	// Checker touches no other row.
	States statedb.RWTable[*lb.ServiceState]
	// Lister returns the sockets' lister, nil when there is none (the
	// maps' opener gave none): then nothing is checked. It is called when
	// the Checker runs, after the start hooks.
	Lister func() Lister
	// Interval and MinInterval: 0 is the package's constant.
	Interval    time.Duration
	MinInterval time.Duration
	Log         *slog.Logger
}

// Checker keeps the host-socket rows of the service states table. Create
// it with New; Run it in one goroutine.
type Checker struct {
	c Config
	// ports are the NodePort and HostPort frontends (owner, type,
	// address) of the last listing, socks the sockets it found: a change
	// of the frontends that leaves the ports as they are (new backends,
	// reconciliation) is matched against socks without listing again.
	ports map[portKey]bool
	socks []hostsockets.Socket
	// procs are the processes named since the last listing (a /proc
	// walk each).
	procs map[uint32]hostsockets.Process
}

type portKey struct {
	owner, typ string
	addr       lb.L4Addr
}

// New returns a Checker; it starts nothing.
func New(c Config) *Checker {
	if c.Interval == 0 {
		c.Interval = Interval
	}
	if c.MinInterval == 0 {
		c.MinInterval = MinInterval
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return &Checker{c: c}
}

// Run checks until ctx ends: at once, when the frontends change (at most
// once per MinInterval) and every Interval.
func (c *Checker) Run(ctx context.Context, health interface {
	OK(string)
	Degraded(string, error)
}) {
	var l Lister
	if c.c.Lister != nil {
		l = c.c.Lister()
	}
	if l == nil {
		health.OK("no socket lister: host ports not checked")
		return
	}
	notifier, _ := l.(Notifier)
	relist := true
	for {
		var changed <-chan struct{}
		if notifier != nil {
			changed = notifier.Changed()
		}
		w, n, err := c.Step(l, relist)
		if err != nil {
			c.c.Log.Warn("Could not check the host's sockets against the NodePorts and hostPorts", "error", err)
			health.Degraded("check host sockets", err)
		} else {
			health.OK(fmt.Sprintf("%d Services or pods share a port with a host socket", n))
		}
		// The next step: not before MinInterval, then on a change or
		// after Interval.
		select {
		case <-ctx.Done():
			return
		case <-time.After(c.c.MinInterval):
		}
		select {
		case <-ctx.Done():
			return
		case <-w:
			relist = false
		case <-changed:
			relist = true
		case <-time.After(c.c.Interval - c.c.MinInterval):
			relist = true
		}
	}
}

// Step rewrites the host-socket rows: it lists the sockets when relist
// is set or the NodePort and HostPort frontends are not those of the last
// listing (and there are any), else it matches the last listing's
// sockets. It returns a channel closed when the frontends change, and how
// many rows there are. The rows are kept when the listing fails.
func (c *Checker) Step(l Lister, relist bool) (<-chan struct{}, int, error) {
	rtxn := c.c.DB.ReadTxn()
	all, w := c.c.Frontends.AllWatch(rtxn)
	var fes []*lb.Frontend
	ports := map[portKey]bool{}
	for f := range all {
		if (f.Type == lb.TypeNodePort || f.Type == lb.TypeHostPort) && f.Status.Kind != reconciler.StatusPendingDelete {
			fes = append(fes, f)
			ports[portKey{f.Service, f.Type, f.Address}] = true
		}
	}
	switch {
	case len(fes) == 0:
		c.ports, c.socks = ports, nil
	case relist || c.ports == nil || !maps.Equal(ports, c.ports):
		socks, err := l.Listening()
		if err != nil {
			c.ports = nil // listed again at the next step
			return w, 0, fmt.Errorf("list the host's sockets: %w", err)
		}
		c.ports, c.socks, c.procs = ports, socks, nil
	}
	want := Conflicts(fes, c.socks, func(inodes []uint32) map[uint32]hostsockets.Process {
		return c.processes(l, inodes)
	})
	n, err := c.write(want)
	return w, n, err
}

// processes names the processes of inodes, asking l only for those not
// named since the last listing.
func (c *Checker) processes(l Lister, inodes []uint32) map[uint32]hostsockets.Process {
	if c.procs == nil {
		c.procs = map[uint32]hostsockets.Process{}
	}
	var ask []uint32
	for _, i := range inodes {
		if _, ok := c.procs[i]; !ok {
			ask = append(ask, i)
		}
	}
	if len(ask) > 0 {
		got := l.Processes(ask)
		for _, i := range ask {
			// Unnamed ones are remembered too (not asked again).
			c.procs[i] = got[i]
		}
	}
	out := map[uint32]hostsockets.Process{}
	for _, i := range inodes {
		if p := c.procs[i]; p.PID != 0 {
			out[i] = p
		}
	}
	return out
}

// write makes the host-socket rows of the states table want.
func (c *Checker) write(want []*lb.ServiceState) (int, error) {
	wtxn := c.c.DB.WriteTxn(c.c.States)
	defer wtxn.Abort()
	keep := map[string]bool{}
	for _, s := range want {
		keep[s.Owner] = true
		if old, _, ok := c.c.States.Get(wtxn, lb.ServiceStateOwnerIndex.Query(s.Owner)); ok && *old == *s {
			continue
		}
		if _, _, err := c.c.States.Insert(wtxn, s); err != nil {
			return 0, fmt.Errorf("write state of %s: %w", s.Owner, err)
		}
	}
	var stale []*lb.ServiceState
	for s := range c.c.States.All(wtxn) {
		if strings.HasSuffix(s.Owner, lb.HostSocketSuffix) && !keep[s.Owner] {
			stale = append(stale, s)
		}
	}
	for _, s := range stale {
		if _, _, err := c.c.States.Delete(wtxn, s); err != nil {
			return 0, fmt.Errorf("delete state of %s: %w", s.Owner, err)
		}
	}
	wtxn.Commit()
	return len(want), nil
}

// Conflicts returns a Degraded row (ReasonHostPortInUse, owner
// lb.HostSocketOwner of the frontend's Service) per Service or pod one of
// whose NodePort or HostPort frontends fes has the protocol and port of
// a socket of socks bound to a wildcard address or to the frontend's
// address; sockets the agent holds (Own) are left out. processes (may be
// nil) names the sockets' processes. Rows are sorted by owner.
func Conflicts(fes []*lb.Frontend, socks []hostsockets.Socket, processes func([]uint32) map[uint32]hostsockets.Process) []*lb.ServiceState {
	type key struct {
		owner string
		typ   string
		port  uint16
		proto uint8
		sock  hostsockets.Socket
	}
	seen := map[key]bool{}
	var hits []key
	for _, f := range fes {
		if f.Type != lb.TypeNodePort && f.Type != lb.TypeHostPort {
			continue
		}
		for _, s := range socks {
			if s.Own || s.Proto != f.Address.Proto || s.Port != f.Address.Port {
				continue
			}
			if !s.Wildcard() && (s.Addr != f.Address.Addr || f.Address.Addr.IsUnspecified()) {
				continue
			}
			k := key{f.Service, f.Type, f.Address.Port, f.Address.Proto, s}
			if !seen[k] {
				seen[k] = true
				hits = append(hits, k)
			}
		}
	}
	if len(hits) == 0 {
		return nil
	}
	var procs map[uint32]hostsockets.Process
	if processes != nil {
		inodes := make([]uint32, 0, len(hits))
		for _, h := range hits {
			inodes = append(inodes, h.sock.Inode)
		}
		procs = processes(inodes)
	}
	slices.SortFunc(hits, func(a, b key) int {
		return cmp.Or(strings.Compare(a.owner, b.owner), cmp.Compare(a.port, b.port), cmp.Compare(a.proto, b.proto),
			a.sock.Addr.Compare(b.sock.Addr), cmp.Compare(a.sock.Inode, b.sock.Inode))
	})
	var out []*lb.ServiceState
	for i := 0; i < len(hits); {
		j := i
		var items []string
		for ; j < len(hits) && hits[j].owner == hits[i].owner; j++ {
			h := hits[j]
			item := fmt.Sprintf("%s %d/%s: a host socket is bound to %s", h.typ, h.port, lb.ProtoName(h.proto),
				netip.AddrPortFrom(h.sock.Addr, h.sock.Port))
			if p, ok := procs[h.sock.Inode]; ok {
				item += " by " + p.String()
			}
			items = append(items, item)
		}
		out = append(out, &lb.ServiceState{Owner: lb.HostSocketOwner(hits[i].owner), State: lb.StateDegraded,
			Reason: lb.ReasonHostPortInUse, Message: message(hits[i].owner, items)})
		i = j
	}
	return out
}

// message says what collides and what it means for the owner's traffic.
func message(owner string, items []string) string {
	what, fix := "the Service", "change the Service's nodePort"
	if strings.HasSuffix(owner, lb.HostPortSuffix) {
		what, fix = "the pod", "change the pod's hostPort"
	}
	const limit = 5
	list := strings.Join(items, "; ")
	if len(items) > limit {
		list = fmt.Sprintf("%s; and %d more", strings.Join(items[:limit], "; "), len(items)-limit)
	}
	return fmt.Sprintf("%s. Traffic from outside the node to the port goes to %s; the host socket gets none of it (stop the process or move it to another port, or %s)",
		list, what, fix)
}
