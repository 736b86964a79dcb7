package kvstoresync

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"time"

	"github.com/cilium/statedb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/statedb/tables"
)

// mirror keeps a table equal to the parsed keys under an etcd prefix: it
// lists the prefix, then follows a watch from the list's revision; when
// the watch fails (compaction, etcd gone for good) it lists again after a
// pause. Rows stay while etcd is unreachable: only a list or a deletion
// event removes one.
type mirror[T any] struct {
	name   string // for logs and the metric: "nodes", "ip"
	prefix string
	etcd   *clientv3.Client
	db     *statedb.DB
	table  statedb.RWTable[T]
	// parse reads a key; an error is garbage (warned and counted), a nil
	// row with no error a key to leave out silently (the local node).
	parse   func(key string, v []byte, rev int64) (T, bool, error)
	invalid func() // counts a garbage key
	log     *slog.Logger
	init    tables.InitGate

	// rows are the rows by etcd key; bad the garbage keys already warned
	// about (by mod revision, so a rewrite is warned about again).
	rows map[string]T
	bad  map[string]int64
}

// run lists and watches until ctx ends.
func (m *mirror[T]) run(ctx context.Context, h hive.Health) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		rev, err := m.list(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			h.Degraded("list "+m.prefix, err)
			m.log.Warn("Cannot list kvstore keys; keeping what the table holds and retrying", "prefix", m.prefix, "error", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 5*time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
		h.OK(fmt.Sprintf("%d keys", len(m.rows)))
		err = m.watch(ctx, rev+1, h)
		if ctx.Err() != nil {
			return
		}
		h.Degraded("watch "+m.prefix, err)
		m.log.Warn("kvstore watch ended; listing again", "prefix", m.prefix, "error", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// list reads every key of the prefix and makes the table equal to them;
// it returns the list's revision.
func (m *mirror[T]) list(ctx context.Context) (int64, error) {
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := m.etcd.Get(lctx, m.prefix, clientv3.WithPrefix())
	if err != nil {
		return 0, fmt.Errorf("list %s: %w", m.prefix, err)
	}
	want := map[string]T{}
	for _, kv := range resp.Kvs {
		if row, ok := m.parseKV(kv); ok {
			want[string(kv.Key)] = row
		}
	}
	wtxn := m.db.WriteTxn(m.table)
	defer wtxn.Abort()
	for key, row := range m.rows {
		if _, ok := want[key]; !ok {
			if _, _, err := m.table.Delete(wtxn, row); err != nil {
				return 0, fmt.Errorf("delete %s: %w", key, err)
			}
		}
	}
	for key, row := range want {
		if _, _, err := m.table.Insert(wtxn, row); err != nil {
			return 0, fmt.Errorf("insert %s: %w", key, err)
		}
	}
	m.init.Open(wtxn)
	wtxn.Commit()
	m.rows = want
	for key := range m.bad {
		if !containsKey(resp.Kvs, key) {
			delete(m.bad, key)
		}
	}
	return resp.Header.Revision, nil
}

func containsKey(kvs []*mvccpb.KeyValue, key string) bool {
	for _, kv := range kvs {
		if string(kv.Key) == key {
			return true
		}
	}
	return false
}

// parseKV parses one key; garbage is warned about (once per revision)
// and counted.
func (m *mirror[T]) parseKV(kv *mvccpb.KeyValue) (T, bool) {
	key := string(kv.Key)
	row, keep, err := m.parse(key, kv.Value, kv.ModRevision)
	if err != nil {
		if m.bad[key] != kv.ModRevision {
			m.bad[key] = kv.ModRevision
			m.invalid()
			m.log.Warn("Ignoring invalid kvstore key", "key", key, "value", truncate(kv.Value), "error", err)
		}
		return row, false
	}
	delete(m.bad, key)
	return row, keep
}

// watch applies the events from revision from until the watch fails.
func (m *mirror[T]) watch(ctx context.Context, from int64, h hive.Health) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wch := m.etcd.Watch(clientv3.WithRequireLeader(wctx), m.prefix, clientv3.WithPrefix(), clientv3.WithRev(from))
	for resp := range wch {
		if err := resp.Err(); err != nil {
			return err
		}
		if len(resp.Events) == 0 {
			continue
		}
		if err := m.apply(resp.Events); err != nil {
			return err
		}
		h.OK(fmt.Sprintf("%d keys", len(m.rows)))
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("watch of %s closed", m.prefix)
}

// apply writes the rows of a batch of events in one transaction. A key
// that turns into garbage loses its row.
func (m *mirror[T]) apply(evs []*clientv3.Event) error {
	rows := maps.Clone(m.rows)
	wtxn := m.db.WriteTxn(m.table)
	defer wtxn.Abort()
	for _, ev := range evs {
		key := string(ev.Kv.Key)
		old, had := rows[key]
		var (
			row  T
			keep bool
		)
		if ev.Type == clientv3.EventTypePut {
			row, keep = m.parseKV(ev.Kv)
		} else {
			delete(m.bad, key)
		}
		if had && !keep {
			if _, _, err := m.table.Delete(wtxn, old); err != nil {
				return fmt.Errorf("delete %s: %w", key, err)
			}
			delete(rows, key)
		}
		if keep {
			if _, _, err := m.table.Insert(wtxn, row); err != nil {
				return fmt.Errorf("insert %s: %w", key, err)
			}
			rows[key] = row
		}
	}
	wtxn.Commit()
	m.rows = rows
	return nil
}

func truncate(b []byte) string {
	if len(b) > 64 {
		return fmt.Sprintf("%q...", b[:64])
	}
	return fmt.Sprintf("%q", b)
}
