package ipcache

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strconv"

	"github.com/cilium/statedb"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/ipcache"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	kvtables "github.com/cellium/cellium/statedb/kvstore"
	"github.com/cellium/cellium/statedb/lb"
	"github.com/cellium/cellium/statedb/nodes"
	"github.com/cellium/cellium/statedb/policy"
	"github.com/cellium/cellium/statedb/reconciler"
	"github.com/cellium/cellium/statedb/tables"
)

// Tables are the tables the deriver reads, and the ipcache table it
// writes.
type Tables struct {
	DB        *statedb.DB
	Endpoints statedb.Table[*endpoints.Endpoint]
	LocalNode statedb.Table[*nodes.LocalNode]
	Nodes     statedb.Table[*nodes.Node]
	CEPs      statedb.Table[*ciliumv2.CiliumEndpoint]
	CIDRs     statedb.Table[*policy.CIDRIdentity]
	// Identities are the CiliumIdentities a CEP's identity must be one of.
	Identities statedb.Table[*ciliumv2.CiliumIdentity]
	// Frontends are the socket load balancer's frontends, whose
	// addresses are marked ServiceFrontend; nil while the socket load
	// balancer is off (its addresses are then left as they are: world).
	Frontends statedb.Table[*lb.Frontend]
	IPCache   statedb.RWTable[*ipcache.Entry]
	// Refused is the refused-CEPs table the deriver writes beside the
	// ipcache (the doctor reads it); nil: not kept.
	Refused statedb.RWTable[*ipcache.RefusedCEP]
	// KVStore are the ipcache keys of the etcd kvstore (source kvstore);
	// nil: none (no kvstoresync cell).
	KVStore statedb.Table[*kvtables.IPEntry]
}

func (t Tables) inputs() []statedb.TableMeta {
	in := []statedb.TableMeta{t.Endpoints, t.LocalNode, t.Nodes, t.CEPs, t.CIDRs, t.Identities}
	if t.Frontends != nil {
		in = append(in, t.Frontends)
	}
	if t.KVStore != nil {
		in = append(in, t.KVStore)
	}
	return in
}

// Deriver keeps the ipcache table equal to what its input tables claim
// (see FromScratch), incrementally: each change of an input replaces the
// claims of the one object that changed and rewrites only the prefixes
// whose winner changed.
type Deriver struct {
	t    Tables
	st   *state
	init tables.InitGate

	eps   statedb.ChangeIterator[*endpoints.Endpoint]
	local statedb.ChangeIterator[*nodes.LocalNode]
	nodes statedb.ChangeIterator[*nodes.Node]
	ceps  statedb.ChangeIterator[*ciliumv2.CiliumEndpoint]
	cidrs statedb.ChangeIterator[*policy.CIDRIdentity]
	ids   statedb.ChangeIterator[*ciliumv2.CiliumIdentity]
	fes   statedb.ChangeIterator[*lb.Frontend]      // nil without Tables.Frontends
	kvs   statedb.ChangeIterator[*kvtables.IPEntry] // nil without Tables.KVStore

	// The local node as both tables show it, and the addresses they
	// give it (which mark the CEPs of this node).
	localRow   *nodes.LocalNode
	localNode  *nodes.Node
	localAddrs map[netip.Addr]bool

	// deferred are the prefixes that lost every claim before the table
	// was initialized: their rows stay (a restarted agent's map keeps
	// serving them) until initialization decides about them again.
	deferred map[netip.Prefix]struct{}

	// nodeIPs are each node's InternalIPs as last seen: the CEPs naming
	// them are checked again when the node changes or goes.
	nodeIPs map[string][]netip.Addr
	// refused are the CEPs whose claims the checks refuse, by key (and
	// their number by reason), and conflicts the prefixes whose
	// acceptable CEPs disagree.
	refused   map[string]refusal
	refusedBy map[Refusal]int
	// refusedDirty are the keys of refused whose rows in the refused-CEPs
	// table are to be written again.
	refusedDirty map[string]struct{}
	conflicts    map[netip.Prefix]struct{}
	// synced is set once every input table is initialized: refusals are
	// logged and counted from then on (before, a CEP listed ahead of its
	// CiliumIdentity or CiliumNode is no news).
	synced bool
	stats  *trustStats
	log    *slog.Logger
}

// NewDeriver registers the deriver as the ipcache table's initializer:
// the table (and so the map's pruning) is initialized only once every
// input table is and the local node has its router IP, so that a
// restarted agent never prunes an entry it will want again a moment
// later. It starts nothing. log (nil: none) hears of each CiliumEndpoint
// the checks refuse.
func NewDeriver(t Tables, log *slog.Logger) *Deriver {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	wtxn := t.DB.WriteTxn(t.IPCache)
	d := &Deriver{t: t, st: newState(), localAddrs: map[netip.Addr]bool{}, deferred: map[netip.Prefix]struct{}{},
		init:    tables.NewInitGate(t.IPCache.RegisterInitializer(wtxn, "ipcache-sources")),
		nodeIPs: map[string][]netip.Addr{}, refused: map[string]refusal{}, refusedBy: map[Refusal]int{}, refusedDirty: map[string]struct{}{}, conflicts: map[netip.Prefix]struct{}{},
		stats: newTrustStats(), log: log}
	wtxn.Commit()
	return d
}

// Trust returns how many CiliumEndpoints the checks refuse now, by
// reason, how many they refused since the start, and how many addresses
// have disagreeing CEPs. Safe to call from any goroutine.
func (d *Deriver) Trust() TrustStats { return d.stats.get() }

// Subscribe starts following the input tables' changes; call it in a
// start hook, before Run.
func (d *Deriver) Subscribe() error {
	wtxn := d.t.DB.WriteTxn(d.t.inputs()...)
	defer wtxn.Commit()
	var err error
	if d.eps, err = d.t.Endpoints.Changes(wtxn); err != nil {
		return fmt.Errorf("subscribe to %s: %w", d.t.Endpoints.Name(), err)
	}
	if d.local, err = d.t.LocalNode.Changes(wtxn); err != nil {
		return fmt.Errorf("subscribe to %s: %w", d.t.LocalNode.Name(), err)
	}
	if d.nodes, err = d.t.Nodes.Changes(wtxn); err != nil {
		return fmt.Errorf("subscribe to %s: %w", d.t.Nodes.Name(), err)
	}
	if d.ceps, err = d.t.CEPs.Changes(wtxn); err != nil {
		return fmt.Errorf("subscribe to %s: %w", d.t.CEPs.Name(), err)
	}
	if d.cidrs, err = d.t.CIDRs.Changes(wtxn); err != nil {
		return fmt.Errorf("subscribe to %s: %w", d.t.CIDRs.Name(), err)
	}
	if d.ids, err = d.t.Identities.Changes(wtxn); err != nil {
		return fmt.Errorf("subscribe to %s: %w", d.t.Identities.Name(), err)
	}
	if d.t.Frontends != nil {
		if d.fes, err = d.t.Frontends.Changes(wtxn); err != nil {
			return fmt.Errorf("subscribe to %s: %w", d.t.Frontends.Name(), err)
		}
	}
	if d.t.KVStore != nil {
		if d.kvs, err = d.t.KVStore.Changes(wtxn); err != nil {
			return fmt.Errorf("subscribe to %s: %w", d.t.KVStore.Name(), err)
		}
	}
	return nil
}

func (d *Deriver) close() {
	for _, c := range []interface{ Close() }{d.eps, d.local, d.nodes, d.ceps, d.cidrs, d.ids} {
		if c != nil {
			c.Close()
		}
	}
	if d.fes != nil {
		d.fes.Close()
	}
	if d.kvs != nil {
		d.kvs.Close()
	}
}

// Run derives until ctx ends.
func (d *Deriver) Run(ctx context.Context, health reconciler.Health) {
	if d.eps == nil {
		if err := d.Subscribe(); err != nil {
			health.Degraded("subscribe", err)
			return
		}
	}
	defer d.close()
	tables.RunDeriver(ctx, health, "write ipcache", func(ws *statedb.WatchSet) (string, error) {
		w, err := d.step()
		ws.Add(w.eps, w.local, w.nodes, w.ceps, w.cidrs, w.ids, w.fes, w.kvs, w.init)
		return d.status(), err
	})
}

// CatchUp consumes the input tables' changes up to now and writes the
// ipcache rows they touch, once, as Run does on each wake-up (for tests
// and benchmarks that drive the deriver themselves; call Subscribe
// first).
func (d *Deriver) CatchUp() error {
	_, err := d.step()
	return err
}

// watches are the channels that close when the deriver has more to do.
type watches struct {
	eps, local, nodes, ceps, cidrs, ids <-chan struct{}
	// fes is nil (never closes) without a frontends table, kvs without
	// a kvstore table.
	fes, kvs <-chan struct{}
	// init closes when an input not yet initialized is; nil when the
	// deriver waits for none.
	init <-chan struct{}
}

// step consumes the changes up to now, writes the prefixes they touched,
// and returns the channels that close when there are more.
func (d *Deriver) step() (watches, error) {
	rtxn := d.t.DB.ReadTxn()
	touched := map[netip.Prefix]struct{}{}
	var w watches

	epCh, epsW := d.eps.Next(rtxn)
	w.eps = epsW
	for ch := range epCh {
		owner := endpointOwner(ch.Object.ID)
		if ch.Deleted {
			d.st.set(owner, nil, touched)
		} else {
			d.st.set(owner, endpointClaims(ch.Object), touched)
		}
	}

	localChanged := false
	lnCh, localW := d.local.Next(rtxn)
	w.local = localW
	for ch := range lnCh {
		localChanged = true
		if ch.Deleted {
			d.localRow = nil
		} else {
			d.localRow = ch.Object
		}
	}
	if localChanged {
		d.st.set(localNodeOwner, localNodeClaims(d.localRow), touched)
	}

	nCh, nodesW := d.nodes.Next(rtxn)
	w.nodes = nodesW
	// recheck are the node addresses and identities whose CEPs are to
	// be checked again.
	recheckIPs := map[netip.Addr]struct{}{}
	recheckIDs := map[int64]struct{}{}
	for ch := range nCh {
		n := ch.Object
		for _, a := range d.nodeIPs[n.Name] {
			recheckIPs[a] = struct{}{}
		}
		if ch.Deleted {
			delete(d.nodeIPs, n.Name)
		} else {
			d.nodeIPs[n.Name] = internalIPs(n)
		}
		for _, a := range d.nodeIPs[n.Name] {
			recheckIPs[a] = struct{}{}
		}
		if ch.Deleted {
			d.st.set(nodeOwner(n.Name), nil, touched)
			if d.localNode != nil && d.localNode.Name == n.Name {
				d.localNode, localChanged = nil, true
			}
			continue
		}
		d.st.set(nodeOwner(n.Name), nodeClaims(n), touched)
		switch {
		case n.Local:
			d.localNode, localChanged = n, true
		case d.localNode != nil && d.localNode.Name == n.Name:
			d.localNode, localChanged = nil, true
		}
	}

	idCh, idsW := d.ids.Next(rtxn)
	w.ids = idsW
	for ch := range idCh {
		if id, err := strconv.ParseInt(ch.Object.Name, 10, 64); err == nil {
			recheckIDs[id] = struct{}{}
		}
	}

	tr := d.trust(rtxn)
	if localChanged {
		if addrs := localAddrs(d.localRow, d.localNode); !maps.Equal(addrs, d.localAddrs) {
			// Which CEPs are this node's may have changed: all again.
			d.localAddrs = addrs
			for cep := range d.t.CEPs.All(rtxn) {
				d.setCEP(cep, tr, touched)
			}
			if d.t.KVStore != nil {
				for e := range d.t.KVStore.All(rtxn) {
					d.st.set(kvOwner(e.Prefix), kvClaims(e, d.localAddrs), touched)
				}
			}
			clear(recheckIPs)
			clear(recheckIDs)
		}
	}
	// The CEPs whose node or identity changed: checked again.
	for a := range recheckIPs {
		for cep := range d.t.CEPs.List(rtxn, k8stables.CiliumEndpointNodeIndex.Query(a)) {
			d.setCEP(cep, tr, touched)
		}
	}
	for id := range recheckIDs {
		for cep := range d.t.CEPs.List(rtxn, k8stables.CiliumEndpointIdentityIndex.Query(id)) {
			d.setCEP(cep, tr, touched)
		}
	}

	cepCh, cepsW := d.ceps.Next(rtxn)
	w.ceps = cepsW
	for ch := range cepCh {
		if ch.Deleted {
			d.dropCEP(k8stables.Key(ch.Object), touched)
		} else {
			d.setCEP(ch.Object, tr, touched)
		}
	}

	if d.kvs != nil {
		kvCh, kvsW := d.kvs.Next(rtxn)
		w.kvs = kvsW
		for ch := range kvCh {
			if ch.Deleted {
				d.st.set(kvOwner(ch.Object.Prefix), nil, touched)
			} else {
				d.st.set(kvOwner(ch.Object.Prefix), kvClaims(ch.Object, d.localAddrs), touched)
			}
		}
	}

	cidrCh, cidrsW := d.cidrs.Next(rtxn)
	w.cidrs = cidrsW
	for ch := range cidrCh {
		pfx := ch.Object.Prefix.Masked()
		owner := cidrOwner(pfx)
		if ch.Deleted {
			d.st.set(owner, nil, touched)
		} else {
			d.st.set(owner, cidrClaims(ch.Object), touched)
		}
		if pfx.IsValid() {
			d.st.setCIDR(pfx, ch.Object.Identity, !ch.Deleted, touched)
		}
	}

	if d.fes != nil {
		feCh, fesW := d.fes.Next(rtxn)
		w.fes = fesW
		for ch := range feCh {
			owner := frontendOwner(ch.Object.Address)
			if ch.Deleted {
				d.st.set(owner, nil, touched)
			} else {
				d.st.set(owner, frontendClaims(ch.Object), touched)
			}
		}
	}

	if d.init.Closed() {
		w.init = d.initWatch(rtxn)
	}
	if !d.synced && d.initWatch(rtxn) == nil {
		d.synced = true
		for key, r := range d.refused {
			d.report(key, r)
		}
	}
	// The numbers first: whoever sees the rows sees the numbers too.
	for p := range touched {
		d.noteConflict(p)
	}
	d.stats.set(d.refusedBy, len(d.conflicts))
	return w, d.write(rtxn, touched)
}

// refusal is a refused CEP: why, and what it named.
type refusal struct {
	why  Refusal
	id   int64
	node string
}

// report logs and counts a refusal. Refusals that a CiliumIdentity or
// CiliumNode arriving later may lift (the watches of different resources
// are not ordered) are logged at info level, the others as warnings.
func (d *Deriver) report(key string, r refusal) {
	if !d.synced {
		return
	}
	d.stats.count(r.why)
	level := slog.LevelWarn
	if r.why == RefusedUnknownIdentity || r.why == RefusedUnknownNode {
		level = slog.LevelInfo
	}
	d.log.Log(context.Background(), level, "CiliumEndpoint refused: its addresses stay out of the ipcache",
		"cep", key, "reason", r.why, "identity", r.id, "node", r.node)
}

func (d *Deriver) trust(txn statedb.ReadTxn) trust {
	return trust{txn: txn, identities: d.t.Identities, nodes: d.t.Nodes}
}

// setCEP replaces a CEP's claims by what it claims now, and notes (and
// logs, once per reason) whether the checks refuse it.
func (d *Deriver) setCEP(cep *ciliumv2.CiliumEndpoint, tr trust, touched map[netip.Prefix]struct{}) {
	key := k8stables.Key(cep)
	c, why := cepClaims(cep, d.localAddrs, tr)
	d.st.set(cepOwner(key), c, touched)
	old, was := d.refused[key]
	switch {
	case why == "" && was:
		d.unrefuse(key)
		if d.synced {
			d.log.Debug("CiliumEndpoint no longer refused", "cep", key, "was", old.why)
		}
	case why != "" && why != old.why:
		d.unrefuse(key)
		r := refusal{why: why, id: cep.Status.Identity.ID, node: cep.Status.Networking.NodeIP}
		d.refused[key] = r
		d.refusedDirty[key] = struct{}{}
		d.refusedBy[why]++
		d.report(key, r)
	}
}

// unrefuse forgets that the CEP key is refused.
func (d *Deriver) unrefuse(key string) {
	if r, ok := d.refused[key]; ok {
		delete(d.refused, key)
		d.refusedBy[r.why]--
		d.refusedDirty[key] = struct{}{}
	}
}

// dropCEP forgets a deleted CEP.
func (d *Deriver) dropCEP(key string, touched map[netip.Prefix]struct{}) {
	d.st.set(cepOwner(key), nil, touched)
	d.unrefuse(key)
}

// status is the deriver's health message.
func (d *Deriver) status() string {
	msg := fmt.Sprintf("%d prefixes", len(d.st.byPrefix))
	if len(d.refused) > 0 {
		msg += fmt.Sprintf(", %d CiliumEndpoints refused", len(d.refused))
	}
	if len(d.conflicts) > 0 {
		msg += fmt.Sprintf(", %d addresses with conflicting CiliumEndpoints", len(d.conflicts))
	}
	if len(d.refused) > 0 || len(d.conflicts) > 0 {
		msg += " (see the agent log and cellium_ipcache_cep_refused)"
	}
	return msg
}

// internalIPs are the InternalIPs of n (the NodeInternalIPIndex keys).
func internalIPs(n *nodes.Node) []netip.Addr {
	var out []netip.Addr
	for _, a := range n.Addresses {
		if a.Type == nodes.AddressInternalIP && a.IP.IsValid() {
			out = append(out, a.IP.Unmap())
		}
	}
	return out
}

// initWatch returns the watch channel of the first input that is not yet
// initialized, nil when all are.
func (d *Deriver) initWatch(rtxn statedb.ReadTxn) <-chan struct{} {
	return tables.InitWatch(rtxn, d.t.inputs()...)
}

// ready reports whether the table is complete enough to be pruned
// against: every input initialized and the local node known with its
// router IP (the host's address pods see), unless the node has no pod
// CIDR yet, so that no router IP can come (a new node whose CiliumNode
// the operator has not served: nothing of an earlier run to keep).
func (d *Deriver) ready(rtxn statedb.ReadTxn) bool {
	return d.initWatch(rtxn) == nil && d.localRow != nil &&
		(d.localRow.RouterIP.IsValid() || len(d.localRow.PodCIDRs) == 0)
}

// write makes the rows of the touched prefixes their winners. Before the
// table is initialized a prefix that lost every claim keeps its row: the
// sources are still filling in (a restored endpoint gets its identity a
// moment after the CEP that claimed its address stops counting as remote),
// and deleting the row would delete the map entry that pods of the last
// run rely on. Initialization decides about those prefixes again.
func (d *Deriver) write(rtxn statedb.ReadTxn, touched map[netip.Prefix]struct{}) error {
	initNow := d.init.Closed() && d.ready(rtxn)
	if len(touched) == 0 && !initNow && (d.t.Refused == nil || len(d.refusedDirty) == 0) {
		return nil
	}
	if initNow {
		maps.Copy(touched, d.deferred)
		clear(d.deferred)
	}
	tbls := []statedb.TableMeta{d.t.IPCache}
	if d.t.Refused != nil {
		tbls = append(tbls, d.t.Refused)
	}
	wtxn := d.t.DB.WriteTxn(tbls...)
	defer wtxn.Abort()
	if err := d.writeRefused(wtxn); err != nil {
		return err
	}
	for p := range touched {
		cur, _, found := d.t.IPCache.Get(wtxn, ipcache.PrefixIndex.Query(p))
		pendingDelete := found && cur.Status.Kind == reconciler.StatusPendingDelete
		want, ok := d.st.winner(p)
		switch {
		case ok && found && !pendingDelete && cur.SameAs(want):
		case ok:
			if _, _, err := d.t.IPCache.Insert(wtxn, want.WithStatus(reconciler.Pending())); err != nil {
				return fmt.Errorf("insert %s: %w", p, err)
			}
		case found && !pendingDelete && d.init.Closed() && !initNow:
			d.deferred[p] = struct{}{}
		case found && !pendingDelete:
			if _, _, err := d.t.IPCache.Delete(wtxn, cur); err != nil {
				return fmt.Errorf("delete %s: %w", p, err)
			}
		}
	}
	if initNow {
		d.init.Open(wtxn)
	}
	wtxn.Commit()
	clear(d.refusedDirty)
	return nil
}

// writeRefused writes the rows of the refused-CEPs table whose CEPs
// changed since the last write.
func (d *Deriver) writeRefused(wtxn statedb.WriteTxn) error {
	if d.t.Refused == nil {
		return nil
	}
	for key := range d.refusedDirty {
		r, ok := d.refused[key]
		if !ok {
			if _, _, err := d.t.Refused.Delete(wtxn, &ipcache.RefusedCEP{CEP: key}); err != nil {
				return fmt.Errorf("delete refused CEP %s: %w", key, err)
			}
			continue
		}
		row := &ipcache.RefusedCEP{CEP: key, Reason: r.why, Identity: r.id, NodeIP: r.node}
		if _, _, err := d.t.Refused.Insert(wtxn, row); err != nil {
			return fmt.Errorf("insert refused CEP %s: %w", key, err)
		}
	}
	// Cleared only once the transaction commits: a failed write is
	// retried with the next step.
	return nil
}

// noteConflict records (and logs, when it starts) whether p's CEPs
// disagree.
func (d *Deriver) noteConflict(p netip.Prefix) {
	_, was := d.conflicts[p]
	switch now := d.st.cepConflict(p); {
	case now && !was:
		d.conflicts[p] = struct{}{}
		var owners []string
		for _, oc := range d.st.byPrefix[p] {
			if oc.claim.source == ipcache.SourceCiliumEndpoint {
				owners = append(owners, oc.owner)
			}
		}
		slices.Sort(owners)
		d.log.Warn("CiliumEndpoints disagree about an address: none of them decides its identity",
			"prefix", p, "owners", owners)
	case !now && was:
		delete(d.conflicts, p)
	}
}

// FromScratch computes the ipcache rows (without status) from the input
// tables as they are in txn: what the deriver's table holds once it has
// caught up.
func FromScratch(txn statedb.ReadTxn, t Tables) map[netip.Prefix]*ipcache.Entry {
	st := newState()
	touched := map[netip.Prefix]struct{}{}
	for e := range t.Endpoints.All(txn) {
		st.set(endpointOwner(e.ID), endpointClaims(e), touched)
	}
	var localRow *nodes.LocalNode
	for n := range t.LocalNode.All(txn) {
		localRow = n
	}
	st.set(localNodeOwner, localNodeClaims(localRow), touched)
	var localNode *nodes.Node
	for n := range t.Nodes.All(txn) {
		st.set(nodeOwner(n.Name), nodeClaims(n), touched)
		if n.Local {
			localNode = n
		}
	}
	local := localAddrs(localRow, localNode)
	tr := trust{txn: txn, identities: t.Identities, nodes: t.Nodes}
	for cep := range t.CEPs.All(txn) {
		c, _ := cepClaims(cep, local, tr)
		st.set(cepOwner(k8stables.Key(cep)), c, touched)
	}
	if t.KVStore != nil {
		for e := range t.KVStore.All(txn) {
			st.set(kvOwner(e.Prefix), kvClaims(e, local), touched)
		}
	}
	for c := range t.CIDRs.All(txn) {
		st.set(cidrOwner(c.Prefix.Masked()), cidrClaims(c), touched)
		if c.Prefix.IsValid() {
			st.setCIDR(c.Prefix.Masked(), c.Identity, true, touched)
		}
	}
	if t.Frontends != nil {
		for f := range t.Frontends.All(txn) {
			st.set(frontendOwner(f.Address), frontendClaims(f), touched)
		}
	}
	out := map[netip.Prefix]*ipcache.Entry{}
	for p := range touched {
		if e, ok := st.winner(p); ok {
			out[p] = e
		}
	}
	return out
}
