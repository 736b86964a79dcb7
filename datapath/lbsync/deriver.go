package lbsync

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	lbmaps "github.com/cellium/cellium/datapath/maps"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/lb"
	"github.com/cellium/cellium/statedb/nodes"
	"github.com/cellium/cellium/statedb/reconciler"
	"github.com/cellium/cellium/statedb/tables"
)

// MaxBackendID is the highest backend ID with the default map size (the
// backends map holds 65536 entries); Tables.MaxBackendID raises it.
const MaxBackendID = 65535

// ErrNoBackendID means every backend ID is in use.
var ErrNoBackendID = errors.New("no free backend ID: more distinct backends than the backends map holds")

// Tables are the tables the deriver reads and writes.
type Tables struct {
	DB        *statedb.DB
	Services  statedb.Table[*corev1.Service]
	Slices    statedb.Table[*discoveryv1.EndpointSlice]
	Frontends statedb.RWTable[*lb.Frontend]
	Backends  statedb.RWTable[*lb.Backend]
	// KubeProxyReplacement derives every Service type's frontends
	// (lb.DeriveFrontends); NodeName and LocalNode (this node's row,
	// for its addresses) are read only then.
	KubeProxyReplacement bool
	NodeName             string
	LocalNode            statedb.Table[*nodes.LocalNode]
	// Pods are this node's pods: with it, their hostPorts are frontends
	// too (lb.PodHostPortFrontends, --enable-host-port). NodeName and
	// LocalNode must be set with it.
	Pods statedb.Table[*corev1.Pod]
	// SourceRangeCheck and SourceRangeAllTypes give frontends the
	// loadBalancerSourceRanges of their Service (lb.Options), with
	// KubeProxyReplacement.
	SourceRangeCheck    bool
	SourceRangeAllTypes bool
	// ServiceProxyName is lb.Options.ServiceProxyName
	// (--k8s-service-proxy-name).
	ServiceProxyName string
	// MaxBackendID is the highest backend ID handed out (the backends
	// map's capacity - 1, --bpf-lb-map-max); 0 is MaxBackendID.
	MaxBackendID uint32
	// MaxServiceEntries is the services map's capacity (--bpf-lb-map-max):
	// a Service whose frontends and backend slots would not fit beside
	// the others' is refused whole; 0 is maps.DefaultLBMapMax.
	MaxServiceEntries int
	// States, when set, gets a row per Service (or pod's hostPorts) not
	// served as asked: refused (too large for the maps, a frontend owned
	// by another) or degraded (endpoints skipped).
	States statedb.RWTable[*lb.ServiceState]
}

// Deriver keeps the lb-frontends and lb-backends tables derived from the
// Services and EndpointSlices tables (lb.ServiceFrontends per Service).
// Create it with NewDeriver; Run it in one goroutine.
type Deriver struct {
	t       Tables
	svcs    statedb.ChangeIterator[*corev1.Service]
	slices  statedb.ChangeIterator[*discoveryv1.EndpointSlice]
	pods    statedb.ChangeIterator[*corev1.Pod] // nil without Tables.Pods
	podsW   <-chan struct{}
	init    tables.InitGate
	restore func() (map[lb.L4Addr]uint32, error)

	// sliceSvc is the Service each slice was last seen to belong to, so
	// that a slice moving to another Service recomputes both.
	sliceSvc map[string]string
	// refs counts the frontends using each backend; ids and used are
	// the backend IDs handed out; next is where the search for a free
	// one starts.
	refs map[lb.L4Addr]int
	ids  map[lb.L4Addr]uint32
	used map[uint32]bool
	next uint32
	// idle are the backends that hold an ID but no reference (until the
	// step releases them), kept with refs (addRef) so that check counts
	// the IDs it could free without a walk over every backend.
	idle map[lb.L4Addr]struct{}
	// restored are IDs the backends map held when the agent started:
	// a backend gets its old ID back, so that the services map's slots
	// stay right while they are rewritten.
	// They are reserved (reserved) until the tables are initialized.
	restored map[lb.L4Addr]uint32
	reserved map[uint32]bool
	// failed are the Services of a step that failed, derived again.
	failed map[string]struct{}
	// maxID is the highest backend ID (MaxBackendID; tests lower it).
	maxID uint32
	// nodeAddrs are the local node's IPv4 addresses the last step
	// derived NodePorts on; nodeW closes when its row changes.
	nodeAddrs []netip.Addr
	nodeW     <-chan struct{}
	// entries are the services map entries (slot 0s and slots) each
	// Service's frontends take, total their sum; maxEntries is the map's
	// capacity.
	entries    map[string]int
	total      int
	maxEntries int
	// refused are the Services refused at their last derivation: they
	// are derived again at every step (room may have been made, the
	// owner of their frontend gone).
	refused map[string]bool
	// undo records a step's changes of the above (nil between steps).
	undo *undo
}

// undo is what a step changed of the deriver's memory of the tables, as
// it was before, to put back when the step fails; kept per changed key
// instead of a copy of it all, which at 10,000 Services (100,000
// backends) cost each step milliseconds and megabytes.
type undo struct {
	backends map[lb.L4Addr]backendBook
	used     map[uint32]bool
	services map[string]serviceBook
	next     uint32
	total    int
}

// backendBook is a backend's refs, ids and idle entries.
type backendBook struct {
	refs           int
	hasRefs, hasID bool
	id             uint32
	idle           bool
}

// serviceBook is a Service's entries and refused entries.
type serviceBook struct {
	entries    int
	hasEntries bool
	refused    bool
}

// begin starts recording a step's changes (keep*).
func (d *Deriver) begin() {
	d.undo = &undo{backends: map[lb.L4Addr]backendBook{}, used: map[uint32]bool{}, services: map[string]serviceBook{},
		next: d.next, total: d.total}
}

// keepBackend records b's entries before the step's first change of them.
func (d *Deriver) keepBackend(b lb.L4Addr) {
	if d.undo == nil {
		return
	}
	if _, ok := d.undo.backends[b]; ok {
		return
	}
	var k backendBook
	k.refs, k.hasRefs = d.refs[b]
	k.id, k.hasID = d.ids[b]
	_, k.idle = d.idle[b]
	d.undo.backends[b] = k
}

// keepID records whether id is used before the step's first change of it.
func (d *Deriver) keepID(id uint32) {
	if d.undo == nil {
		return
	}
	if _, ok := d.undo.used[id]; !ok {
		d.undo.used[id] = d.used[id]
	}
}

// keepService records name's entries before the step's first change of
// them.
func (d *Deriver) keepService(name string) {
	if d.undo == nil {
		return
	}
	if _, ok := d.undo.services[name]; ok {
		return
	}
	var k serviceBook
	k.entries, k.hasEntries = d.entries[name]
	k.refused = d.refused[name]
	d.undo.services[name] = k
}

// rollback puts back what the step changed; commit forgets it.
func (d *Deriver) rollback() {
	u := d.undo
	d.undo = nil
	for b, k := range u.backends {
		delete(d.refs, b)
		delete(d.ids, b)
		delete(d.idle, b)
		if k.hasRefs {
			d.refs[b] = k.refs
		}
		if k.hasID {
			d.ids[b] = k.id
		}
		if k.idle {
			d.idle[b] = struct{}{}
		}
	}
	for id, used := range u.used {
		if used {
			d.used[id] = true
		} else {
			delete(d.used, id)
		}
	}
	for name, k := range u.services {
		delete(d.entries, name)
		delete(d.refused, name)
		if k.hasEntries {
			d.entries[name] = k.entries
		}
		if k.refused {
			d.refused[name] = true
		}
	}
	d.next, d.total = u.next, u.total
}

func (d *Deriver) commit() { d.undo = nil }

// after returns a channel closed after dt.
func after(dt time.Duration) <-chan struct{} {
	ch := make(chan struct{})
	time.AfterFunc(dt, func() { close(ch) })
	return ch
}

// NewDeriver registers the deriver as the initializer of the two tables:
// they are initialized (and the maps pruned) only once the Services and
// EndpointSlices tables are. restore, when not nil, returns the backend
// IDs the backends map holds; it is called once, at the first step. It
// starts nothing.
func NewDeriver(t Tables, restore func() (map[lb.L4Addr]uint32, error)) *Deriver {
	wtxn := t.DB.WriteTxn(t.Frontends, t.Backends)
	d := &Deriver{t: t, restore: restore, init: tables.NewInitGate(
		t.Frontends.RegisterInitializer(wtxn, "k8s-services"),
		t.Backends.RegisterInitializer(wtxn, "k8s-services"),
	), sliceSvc: map[string]string{}, refs: map[lb.L4Addr]int{}, ids: map[lb.L4Addr]uint32{},
		used: map[uint32]bool{}, idle: map[lb.L4Addr]struct{}{}, next: 1, maxID: MaxBackendID,
		entries: map[string]int{}, refused: map[string]bool{}, maxEntries: lbmaps.DefaultLBMapMax}
	if t.MaxBackendID != 0 {
		d.maxID = t.MaxBackendID
	}
	if t.MaxServiceEntries != 0 {
		d.maxEntries = t.MaxServiceEntries
	}
	wtxn.Commit()
	return d
}

// Subscribe starts following the input tables; call it in a start hook.
func (d *Deriver) Subscribe() error {
	tables := []statedb.TableMeta{d.t.Services, d.t.Slices}
	if d.t.Pods != nil {
		tables = append(tables, d.t.Pods)
	}
	wtxn := d.t.DB.WriteTxn(tables...)
	defer wtxn.Commit()
	var err error
	if d.svcs, err = d.t.Services.Changes(wtxn); err != nil {
		return fmt.Errorf("subscribe to %s: %w", d.t.Services.Name(), err)
	}
	if d.slices, err = d.t.Slices.Changes(wtxn); err != nil {
		return fmt.Errorf("subscribe to %s: %w", d.t.Slices.Name(), err)
	}
	if d.t.Pods != nil {
		if d.pods, err = d.t.Pods.Changes(wtxn); err != nil {
			return fmt.Errorf("subscribe to %s: %w", d.t.Pods.Name(), err)
		}
	}
	return nil
}

func (d *Deriver) close() {
	if d.svcs != nil {
		d.svcs.Close()
	}
	if d.slices != nil {
		d.slices.Close()
	}
	if d.pods != nil {
		d.pods.Close()
	}
}

// Run derives until ctx ends.
func (d *Deriver) Run(ctx context.Context, health reconciler.Health) {
	if d.svcs == nil {
		if err := d.Subscribe(); err != nil {
			health.Degraded("subscribe", err)
			return
		}
	}
	defer d.close()
	for {
		svcW, slW, initW, err := d.Step()
		if err != nil {
			health.Degraded("derive load-balancer tables", err)
		} else {
			health.OK("derived")
		}
		select {
		case <-ctx.Done():
			return
		case <-svcW:
		case <-slW:
		case <-initW:
		case <-d.nodeW:
		case <-d.podsW:
		}
	}
}

// Step consumes the changes up to now and rewrites the frontends of the
// Services they touch. It returns the channels that close when there is
// more to do. Subscribe first.
func (d *Deriver) Step() (svcW, slW, initW <-chan struct{}, err error) {
	var restoreErr error
	if d.restore != nil {
		// Without the map's IDs the backends get new ones: the services
		// map is rewritten with them, only the restart is less smooth.
		ids, err := d.restore()
		if err != nil {
			restoreErr = fmt.Errorf("read the backend IDs of the backends map (new IDs are given): %w", err)
		}
		d.restored, d.restore = ids, nil
		d.reserved = map[uint32]bool{}
		for _, id := range ids {
			d.reserved[id] = true
		}
	}
	defer func() { err = errors.Join(restoreErr, err) }()
	rtxn := d.t.DB.ReadTxn()
	touched := map[string]struct{}{}
	svcCh, svcW := d.svcs.Next(rtxn)
	for ch := range svcCh {
		touched[k8stables.Key(ch.Object)] = struct{}{}
	}
	slCh, slW := d.slices.Next(rtxn)
	for ch := range slCh {
		key := k8stables.Key(ch.Object)
		if old, ok := d.sliceSvc[key]; ok {
			touched[old] = struct{}{}
			delete(d.sliceSvc, key)
		}
		if svc, ok := k8stables.EndpointSliceService(ch.Object); ok {
			touched[svc] = struct{}{}
			if !ch.Deleted {
				d.sliceSvc[key] = svc
			}
		}
	}
	if d.pods != nil {
		var podCh iter.Seq2[statedb.Change[*corev1.Pod], statedb.Revision]
		podCh, d.podsW = d.pods.Next(rtxn)
		for ch := range podCh {
			touched[lb.HostPortOwner(k8stables.Key(ch.Object))] = struct{}{}
		}
	}
	initNow := false
	if d.init.Closed() {
		svcInit, w1 := d.t.Services.Initialized(rtxn)
		slInit, w2 := d.t.Slices.Initialized(rtxn)
		podsInit, w3 := true, (<-chan struct{})(nil)
		if d.t.Pods != nil {
			podsInit, w3 = d.t.Pods.Initialized(rtxn)
		}
		// NodePorts and hostPorts need the node's row: without it the
		// first pruning would drop them from the maps of a restarted
		// agent until the row comes.
		nodeKnown, w4 := true, (<-chan struct{})(nil)
		if (d.t.KubeProxyReplacement || d.t.Pods != nil) && d.t.LocalNode != nil {
			_, _, w4, nodeKnown = d.t.LocalNode.GetWatch(rtxn, nodes.LocalNodeNameIndex.Query(d.t.NodeName))
		}
		switch {
		case !svcInit:
			initW = w1
		case !slInit:
			initW = w2
		case !podsInit:
			initW = w3
		case !nodeKnown:
			initW = w4
		default:
			initNow = true
		}
	}
	if (d.t.KubeProxyReplacement || d.t.Pods != nil) && d.t.LocalNode != nil {
		// New node addresses: every NodePort moves.
		addrs, w := d.localAddrs(rtxn)
		d.nodeW = w
		if !slices.Equal(addrs, d.nodeAddrs) {
			d.nodeAddrs = addrs
			for svc := range d.t.Services.All(rtxn) {
				touched[k8stables.Key(svc)] = struct{}{}
			}
			if d.t.Pods != nil {
				for pod := range d.t.Pods.All(rtxn) {
					touched[lb.HostPortOwner(k8stables.Key(pod))] = struct{}{}
				}
			}
		}
	}
	for name := range d.failed {
		touched[name] = struct{}{}
	}
	d.failed = nil
	if len(touched) == 0 && !initNow {
		return svcW, slW, initW, nil
	}
	// Something changed: the refused Services may fit now.
	for name := range d.refused {
		touched[name] = struct{}{}
	}
	// A failed step writes nothing: the bookkeeping goes back to what the
	// tables hold, and the Services are derived again after a second.
	d.begin()
	defer func() {
		if err != nil {
			d.rollback()
			d.failed = touched
			initW = after(time.Second)
		} else {
			d.commit()
		}
	}()
	wtables := []statedb.TableMeta{d.t.Frontends, d.t.Backends}
	if d.t.States != nil {
		wtables = append(wtables, d.t.States)
	}
	wtxn := d.t.DB.WriteTxn(wtables...)
	defer wtxn.Abort()
	var released []lb.L4Addr
	order := d.syncOrder(rtxn, touched)
	// A Service refused in the first pass gets a second: a frontend it
	// wants may have been freed by one after it in the order.
	for pass := range 2 {
		for _, name := range order {
			if pass == 1 && !d.refused[name] {
				continue
			}
			rel, err := d.syncService(rtxn, wtxn, name)
			if err != nil {
				return svcW, slW, initW, fmt.Errorf("service %s: %w", name, err)
			}
			released = append(released, rel...)
		}
	}
	for _, b := range released {
		if n, ok := d.refs[b]; !ok || n > 0 {
			continue // taken again, or released already
		}
		if err := d.release(wtxn, b); err != nil {
			return svcW, slW, initW, err
		}
	}
	if initNow {
		d.init.Open(wtxn)
		// Every Service has been derived: what was not taken back is gone.
		d.restored, d.reserved = nil, nil
	}
	wtxn.Commit()
	return svcW, slW, initW, nil
}

// syncService rewrites the frontends of Service name and returns the
// backends whose reference it dropped (deleted by the caller if nobody
// took them again). A Service that does not fit the maps, or one of whose
// frontends another Service (or pod) owns, is refused whole: it keeps no
// frontend, and its States row says why.
func (d *Deriver) syncService(rtxn statedb.ReadTxn, wtxn statedb.WriteTxn, name string) ([]lb.L4Addr, error) {
	var want []*lb.Frontend
	var problems []string
	o := lb.Options{KubeProxyReplacement: d.t.KubeProxyReplacement, NodeName: d.t.NodeName, NodeAddrs: d.nodeAddrs,
		SourceRangeCheck: d.t.SourceRangeCheck, SourceRangeAllTypes: d.t.SourceRangeAllTypes, ServiceProxyName: d.t.ServiceProxyName}
	if pod, ok := strings.CutSuffix(name, lb.HostPortSuffix); ok {
		if d.t.Pods != nil {
			if p, _, ok := d.t.Pods.Get(rtxn, k8stables.NameIndex[*corev1.Pod]().Query(pod)); ok {
				want = lb.PodHostPortFrontends(p, o)
			}
		}
	} else if svc, _, ok := d.t.Services.Get(rtxn, k8stables.NameIndex[*corev1.Service]().Query(name)); ok {
		var sls []*discoveryv1.EndpointSlice
		for s := range d.t.Slices.List(rtxn, k8stables.EndpointSliceServiceIndex.Query(name)) {
			sls = append(sls, s)
		}
		want = lb.DeriveFrontends(svc, sls, o)
		problems = lb.EndpointSliceProblems(svc, sls)
	}
	// Current frontends of the Service: their references go.
	var cur []*lb.Frontend
	for f := range d.t.Frontends.List(wtxn, lb.FrontendServiceIndex.Query(name)) {
		if f.Status.Kind != reconciler.StatusPendingDelete {
			cur = append(cur, f)
		}
	}
	state := d.check(wtxn, name, want, cur)
	d.keepService(name)
	delete(d.refused, name)
	switch {
	case state != nil:
		want = nil
		d.refused[name] = true
	case len(problems) > 0:
		state = &lb.ServiceState{Owner: name, State: lb.StateDegraded, Reason: lb.ReasonInvalidEndpoints,
			Message: "skipped endpoints: " + joinLimited(problems, 5)}
	}
	if err := d.writeState(wtxn, name, state); err != nil {
		return nil, err
	}
	var released []lb.L4Addr
	wanted := map[lb.L4Addr]bool{}
	for _, f := range want {
		wanted[f.Address] = true
	}
	for _, f := range cur {
		all, _ := f.AllBackends()
		for _, b := range all {
			d.addRef(b, -1)
			released = append(released, b)
		}
		if !wanted[f.Address] {
			if _, _, err := d.t.Frontends.Delete(wtxn, f); err != nil {
				return nil, err
			}
		}
	}
	d.total -= d.entries[name]
	delete(d.entries, name)
	if n := entries(want); n > 0 {
		d.entries[name] = n
		d.total += n
	}
	for _, f := range want {
		var err error
		if f.BackendIDs, err = d.acquireAll(wtxn, f.Backends); err != nil {
			return nil, err
		}
		if f.TwoScopes {
			if f.IntBackendIDs, err = d.acquireAll(wtxn, f.IntBackends); err != nil {
				return nil, err
			}
		}
		if o, _, ok := d.t.Frontends.Get(wtxn, lb.FrontendAddressIndex.Query(f.Address)); ok &&
			o.Status.Kind != reconciler.StatusPendingDelete && o.SameAs(f) {
			continue
		}
		if _, _, err := d.t.Frontends.Insert(wtxn, f.WithStatus(reconciler.Pending())); err != nil {
			return nil, err
		}
	}
	return released, nil
}

// entries returns the services map entries fs take: per scope its slot 0
// and one slot per backend.
func entries(fs []*lb.Frontend) int {
	n := 0
	for _, f := range fs {
		n += 1 + len(f.Backends)
		if f.TwoScopes {
			n += 1 + len(f.IntBackends)
		}
	}
	return n
}

// MaxSlots is the most backends one frontend scope has in the services
// map (its slots are numbered 1..65535 and slot 0 counts them in 16 bits).
const MaxSlots = 65535

// check returns why Service name cannot have the frontends want in place
// of its current ones cur (nil when it can): a frontend another Service
// or pod owns (the first owner keeps it, as in Cilium), a scope with more
// backends than MaxSlots, more services map entries or more new distinct
// backends than the maps have room for beside the other Services'.
func (d *Deriver) check(wtxn statedb.WriteTxn, name string, want, cur []*lb.Frontend) *lb.ServiceState {
	kind := "Service"
	if strings.HasSuffix(name, lb.HostPortSuffix) {
		kind = "pod"
	}
	for _, f := range want {
		o, _, ok := d.t.Frontends.Get(wtxn, lb.FrontendAddressIndex.Query(f.Address))
		if !ok || o.Service == name || o.Status.Kind == reconciler.StatusPendingDelete {
			continue
		}
		owner := "Service " + o.Service
		if pod, ok := strings.CutSuffix(o.Service, lb.HostPortSuffix); ok {
			owner = "the hostPort of pod " + pod
		}
		return &lb.ServiceState{Owner: name, State: lb.StateRefused, Reason: lb.ReasonFrontendConflict,
			Message: fmt.Sprintf("%s frontend %s is owned by %s: none of this %s's frontends is served until it is free",
				f.TypeName(), f.Address, owner, kind)}
	}
	limit := func(what string) *lb.ServiceState {
		return &lb.ServiceState{Owner: name, State: lb.StateRefused, Reason: lb.ReasonLBMapFull,
			Message: what + ": none of its frontends is served (raise --bpf-lb-map-max, or make the Service smaller)"}
	}
	for _, f := range want {
		if len(f.Backends) > MaxSlots || len(f.IntBackends) > MaxSlots {
			return limit(fmt.Sprintf("frontend %s has %d backends, more than a frontend can have (%d)",
				f.Address, max(len(f.Backends), len(f.IntBackends)), MaxSlots))
		}
	}
	// An update writes a scope's new slots before it deletes the old
	// ones (the other bank): room for its largest scope twice.
	need, spare := entries(want), 0
	for _, f := range want {
		spare = max(spare, len(f.Backends), len(f.IntBackends))
	}
	if rest := d.total - d.entries[name]; rest+need+spare > d.maxEntries {
		return limit(fmt.Sprintf("its %d frontends with their backends take %d entries of the services map (and %d more while one is updated), %d are free of --bpf-lb-map-max=%d",
			len(want), need, spare, max(d.maxEntries-rest, 0), d.maxEntries))
	}
	// Backend IDs: the new distinct backends against the free IDs and
	// those only this Service's current frontends hold.
	own := map[lb.L4Addr]int{}
	for _, f := range cur {
		all, _ := f.AllBackends()
		for _, b := range all {
			own[b]++
		}
	}
	wantB := map[lb.L4Addr]bool{}
	fresh := 0
	for _, f := range want {
		all, _ := f.AllBackends()
		for _, b := range all {
			if wantB[b] {
				continue
			}
			wantB[b] = true
			if _, ok := d.ids[b]; !ok {
				fresh++
			}
		}
	}
	if fresh == 0 {
		return nil
	}
	// The IDs held by backends nobody else references (those only this
	// Service's current frontends do, or none) and the Service no longer
	// wants: the idle ones and some of own.
	free := int(d.maxID) - len(d.used)
	for b := range d.idle {
		if !wantB[b] {
			free++
		}
	}
	for b, n := range own {
		if _, ok := d.ids[b]; ok && d.refs[b] > 0 && d.refs[b]-n <= 0 && !wantB[b] {
			free++
		}
	}
	if fresh > free {
		return limit(fmt.Sprintf("it has %d new distinct backends, the backends map has room for %d more of --bpf-lb-map-max=%d",
			fresh, free, d.maxID+1))
	}
	return nil
}

// writeState makes the States row of name s (nil: none).
func (d *Deriver) writeState(wtxn statedb.WriteTxn, name string, s *lb.ServiceState) error {
	if d.t.States == nil {
		return nil
	}
	old, _, ok := d.t.States.Get(wtxn, lb.ServiceStateOwnerIndex.Query(name))
	switch {
	case s == nil && ok:
		if _, _, err := d.t.States.Delete(wtxn, old); err != nil {
			return fmt.Errorf("delete state of %s: %w", name, err)
		}
	case s != nil && (!ok || *old != *s):
		if _, _, err := d.t.States.Insert(wtxn, s); err != nil {
			return fmt.Errorf("write state of %s: %w", name, err)
		}
	}
	return nil
}

// joinLimited joins the first n of ss with "; " and says how many more
// there are.
func joinLimited(ss []string, n int) string {
	if len(ss) <= n {
		return strings.Join(ss, "; ")
	}
	return fmt.Sprintf("%s; and %d more", strings.Join(ss[:n], "; "), len(ss)-n)
}

// syncOrder orders the touched Services for a step: the deleted ones
// first, so that the backend IDs they release are free for the others in
// the same step (the map's order made a step fail now and then with
// ErrNoBackendID near the limit), then by name.
func (d *Deriver) syncOrder(rtxn statedb.ReadTxn, touched map[string]struct{}) []string {
	names := make([]string, 0, len(touched))
	for name := range touched {
		names = append(names, name)
	}
	gone := func(name string) bool {
		if pod, ok := strings.CutSuffix(name, lb.HostPortSuffix); ok {
			if d.t.Pods == nil {
				return true
			}
			_, _, ok := d.t.Pods.Get(rtxn, k8stables.NameIndex[*corev1.Pod]().Query(pod))
			return !ok
		}
		_, _, ok := d.t.Services.Get(rtxn, k8stables.NameIndex[*corev1.Service]().Query(name))
		return !ok
	}
	slices.SortFunc(names, func(a, b string) int {
		if ga, gb := gone(a), gone(b); ga != gb {
			if ga {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	return names
}

// localAddrs returns the IPv4 addresses of this node's local-node row
// (its InternalIPs and ExternalIPs), sorted, and a channel closed when the
// row changes.
func (d *Deriver) localAddrs(rtxn statedb.ReadTxn) ([]netip.Addr, <-chan struct{}) {
	n, _, w, ok := d.t.LocalNode.GetWatch(rtxn, nodes.LocalNodeNameIndex.Query(d.t.NodeName))
	if !ok {
		return nil, w
	}
	var out []netip.Addr
	for _, a := range n.NodeAddresses {
		if a.IP.Is4() {
			out = append(out, a.IP)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out), w
}

// acquireAll acquires each of bs and returns their IDs.
func (d *Deriver) acquireAll(wtxn statedb.WriteTxn, bs []lb.L4Addr) ([]uint32, error) {
	ids := make([]uint32, len(bs))
	for i, b := range bs {
		id, err := d.acquire(wtxn, b)
		if err != nil {
			return nil, err
		}
		ids[i] = id
	}
	return ids, nil
}

// acquire takes a reference on backend b, giving it an ID and a row if
// it has none.
func (d *Deriver) acquire(wtxn statedb.WriteTxn, b lb.L4Addr) (uint32, error) {
	d.addRef(b, 1)
	if id, ok := d.ids[b]; ok {
		return id, nil
	}
	id, err := d.allocate(b)
	if errors.Is(err, ErrNoBackendID) {
		// Backends this step released may still hold IDs.
		if err = d.reclaim(wtxn); err == nil {
			id, err = d.allocate(b)
		}
	}
	if err != nil {
		d.addRef(b, -1)
		return 0, err
	}
	d.keepBackend(b)
	d.keepID(id)
	d.ids[b], d.used[id] = id, true
	d.syncIdle(b)
	if _, _, err := d.t.Backends.Insert(wtxn, &lb.Backend{Address: b, ID: id, Status: reconciler.Pending()}); err != nil {
		return 0, err
	}
	return id, nil
}

// reclaim frees the IDs (and rows) of backends nobody references any more.
func (d *Deriver) reclaim(wtxn statedb.WriteTxn) error {
	for b, n := range d.refs {
		if n > 0 {
			continue
		}
		if err := d.release(wtxn, b); err != nil {
			return err
		}
	}
	return nil
}

// release forgets backend b and deletes its row.
func (d *Deriver) release(wtxn statedb.WriteTxn, b lb.L4Addr) error {
	d.keepBackend(b)
	delete(d.refs, b)
	delete(d.idle, b)
	if cur, _, ok := d.t.Backends.Get(wtxn, lb.BackendAddressIndex.Query(b)); ok && cur.Status.Kind != reconciler.StatusPendingDelete {
		if _, _, err := d.t.Backends.Delete(wtxn, cur); err != nil {
			return err
		}
	}
	if id, ok := d.ids[b]; ok {
		d.keepID(id)
		delete(d.used, id)
		delete(d.ids, b)
	}
	return nil
}

// addRef adds delta to b's references.
func (d *Deriver) addRef(b lb.L4Addr, delta int) {
	d.keepBackend(b)
	d.refs[b] += delta
	d.syncIdle(b)
}

// syncIdle puts b in idle when it holds an ID without a reference, takes
// it out otherwise.
func (d *Deriver) syncIdle(b lb.L4Addr) {
	d.keepBackend(b)
	if _, ok := d.ids[b]; ok && d.refs[b] <= 0 {
		d.idle[b] = struct{}{}
	} else {
		delete(d.idle, b)
	}
}

func (d *Deriver) allocate(b lb.L4Addr) (uint32, error) {
	if id, ok := d.restored[b]; ok && id >= 1 && id <= d.maxID && !d.used[id] {
		return id, nil
	}
	for range d.maxID {
		id := d.next
		d.next = d.next%d.maxID + 1
		if d.used[id] {
			continue
		}
		if d.reserved[id] {
			continue // kept for its backend while it may come back
		}
		return id, nil
	}
	// Every ID is used or reserved: take a reserved one.
	for id := uint32(1); id <= d.maxID; id++ {
		if !d.used[id] {
			return id, nil
		}
	}
	return 0, ErrNoBackendID
}
