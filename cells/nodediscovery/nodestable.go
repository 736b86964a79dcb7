package nodediscovery

import (
	"context"
	"fmt"
	"iter"
	"log/slog"
	"reflect"
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cilium/statedb"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/k8s"
	kvtables "github.com/cellium/cellium/statedb/kvstore"
	"github.com/cellium/cellium/statedb/nodes"
	"github.com/cellium/cellium/statedb/tables"
)

// nodesSyncParams are registerNodesSync's inputs.
type nodesSyncParams struct {
	hive.In

	NodeName    k8s.NodeName
	DB          *statedb.DB
	CiliumNodes statedb.Table[*ciliumv2.CiliumNode]
	Nodes       statedb.RWTable[*nodes.Node]
	Jobs        hive.Jobs
	Log         *slog.Logger
	Registerer  prometheus.Registerer `optional:"true"`
	// KVNodes are the other nodes' kvstore keys (kvstoresync.Cell); a
	// node's key wins over its CiliumNode. Absent: CiliumNodes only.
	KVNodes statedb.Table[*kvtables.Node] `optional:"true"`
}

// registerNodesSync mirrors every CiliumNode into the nodes table (see
// resolveNodes for what is refused), which is marked initialized once the
// CiliumNodes table is and its content has been copied.
func registerNodesSync(p nodesSyncParams) error {
	txn := p.DB.WriteTxn(p.Nodes)
	initGate := tables.NewInitGate(p.Nodes.RegisterInitializer(txn, "ciliumnodes"))
	txn.Commit()

	stats := &refusalStats{refused: map[nodes.RefusalReason]int{}, total: map[nodes.RefusalReason]uint64{}}
	if err := registerRefusalMetrics(p.Registerer, stats); err != nil {
		return err
	}
	var (
		changes   statedb.ChangeIterator[*ciliumv2.CiliumNode]
		kvChanges statedb.ChangeIterator[*kvtables.Node]
	)
	inputs := []statedb.TableMeta{p.CiliumNodes}
	if p.KVNodes != nil {
		inputs = append(inputs, p.KVNodes)
	}
	p.Jobs.Add(hive.Service("nodes-table",
		func() error {
			wtxn := p.DB.WriteTxn(inputs...)
			defer wtxn.Commit()
			var err error
			changes, err = p.CiliumNodes.Changes(wtxn)
			if err != nil {
				return fmt.Errorf("subscribe to %s: %w", p.CiliumNodes.Name(), err)
			}
			if p.KVNodes != nil {
				if kvChanges, err = p.KVNodes.Changes(wtxn); err != nil {
					return fmt.Errorf("subscribe to %s: %w", p.KVNodes.Name(), err)
				}
			}
			return nil
		},
		func(ctx context.Context, h hive.Health) {
			defer changes.Close()
			if kvChanges != nil {
				defer kvChanges.Close()
			}
			h.OK("mirroring CiliumNodes")
			local := string(p.NodeName)
			// refused are the refusals of each node as last logged.
			refused := map[string][]nodes.Refusal{}
			for {
				wtxn := p.DB.WriteTxn(p.Nodes)
				seq, watch := changes.Next(wtxn)
				changed := false
				for range seq {
					changed = true
				}
				var kvWatch <-chan struct{}
				if kvChanges != nil {
					var kvSeq iter.Seq2[statedb.Change[*kvtables.Node], statedb.Revision]
					kvSeq, kvWatch = kvChanges.Next(wtxn)
					for range kvSeq {
						changed = true
					}
				}
				initWatch := tables.InitWatch(wtxn, inputs...)
				init := initWatch == nil
				if changed || (init && initGate.Closed()) {
					// One node's change can settle another's dispute
					// (the holder of an address goes): all again.
					if err := syncNodes(wtxn, p.CiliumNodes, p.KVNodes, p.Nodes, local); err != nil {
						h.Degraded("write the nodes table", err)
					} else {
						noteRefusals(wtxn, p.Nodes, refused, stats, p.Log)
						h.OK(healthMessage(stats))
					}
				}
				if init {
					initGate.Open(wtxn)
				}
				wtxn.Commit()
				if init {
					initWatch = nil
				}
				select {
				case <-ctx.Done():
					return
				case <-watch:
				case <-kvWatch:
				case <-initWatch:
				}
			}
		}))
	return nil
}

// syncNodes makes the nodes table what resolveAll makes of the
// CiliumNodes and the kvstore nodes (kvs, nil: none) as of txn: changed rows are written, rows of deleted
// CiliumNodes deleted.
func syncNodes(txn statedb.WriteTxn, cns statedb.Table[*ciliumv2.CiliumNode], kvs statedb.Table[*kvtables.Node], tbl statedb.RWTable[*nodes.Node], local string) error {
	all := slices.Collect(statedb.ToSeq(cns.All(txn)))
	var kvAll []*kvtables.Node
	if kvs != nil {
		kvAll = slices.Collect(statedb.ToSeq(kvs.All(txn)))
	}
	want := map[string]*nodes.Node{}
	for _, n := range resolveAll(all, kvAll, local) {
		want[n.Name] = n
	}
	for cur := range tbl.All(txn) {
		if _, ok := want[cur.Name]; !ok {
			if _, _, err := tbl.Delete(txn, cur); err != nil {
				return fmt.Errorf("delete node %s: %w", cur.Name, err)
			}
		}
	}
	for name, n := range want {
		if cur, _, ok := tbl.Get(txn, nodes.NodeNameIndex.Query(name)); ok && reflect.DeepEqual(cur, n) {
			continue
		}
		if _, _, err := tbl.Insert(txn, n); err != nil {
			return fmt.Errorf("insert node %s: %w", name, err)
		}
	}
	return nil
}

// noteRefusals logs each refusal that is new since the last call, counts
// it, and sets the current numbers.
func noteRefusals(txn statedb.ReadTxn, tbl statedb.Table[*nodes.Node], last map[string][]nodes.Refusal, stats *refusalStats, log *slog.Logger) {
	now := map[nodes.RefusalReason]int{}
	seen := map[string]bool{}
	for n := range tbl.All(txn) {
		seen[n.Name] = true
		for _, r := range n.Refused {
			now[r.Reason]++
			if !slices.Contains(last[n.Name], r) {
				stats.count(r.Reason)
				log.Warn("CiliumNode refused in part: the agent does not use this address or pod CIDR (cellium doctor explains)",
					"node", n.Name, "field", r.Field, "value", r.Value, "reason", r.Reason, "holder", r.Holder)
			}
		}
		if len(n.Refused) == 0 {
			delete(last, n.Name)
		} else {
			last[n.Name] = n.Refused
		}
	}
	for name := range last {
		if !seen[name] {
			delete(last, name)
		}
	}
	stats.set(now)
}

// healthMessage is the nodes-table job's health message.
func healthMessage(s *refusalStats) string {
	n := 0
	for _, v := range s.get().Refused {
		n += v
	}
	if n == 0 {
		return "mirroring CiliumNodes"
	}
	return fmt.Sprintf("mirroring CiliumNodes, %d addresses or pod CIDRs refused (see cellium doctor and cellium_nodes_refused)", n)
}
