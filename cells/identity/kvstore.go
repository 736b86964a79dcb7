package identity

import (
	"context"
	"fmt"
	"iter"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/statedb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/kvstore"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/labels"
	"github.com/cellium/cellium/statedb/nodes"
	"github.com/cellium/cellium/statedb/reconciler"
)

// lockTTL is the TTL of the lease behind an allocation lock (Cilium's
// LockLeaseTTL, 25 s): a lock of an agent that died mid-allocation frees
// itself at the latest this long after the agent's last keep-alive.
const lockTTL = 25 * time.Second

// kvBackend is the kvstore half of the allocator in
// --identity-allocation-mode=kvstore. Identities are etcd keys in Cilium's
// layout (kvstore.IdentityIDPrefix and friends):
//
//   - the master key id/<ID> holds the labels key; it is created only if
//     absent (a transaction on its create revision), has no lease, and is
//     deleted by the operator's GC once no node uses it;
//   - each node using the identity has a value key
//     value/<labels key>/<node IP> holding the ID, with its session lease,
//     so a dead node's uses vanish with its lease.
//
// A new label set is allocated under an etcd lock on the labels key, as
// Cilium does: an agent that gets the lock second finds the first one's
// value key and takes the same ID. A number already taken by other labels
// (another agent raced for a different label set, or someone wrote
// garbage there) fails the create-only transaction and the next number
// is tried.
type kvBackend struct {
	log    *slog.Logger
	kv     *kvstore.Client
	suffix func(context.Context) (string, error)
	min    identity.NumericIdentity
	max    identity.NumericIdentity
	// lockTTL is the allocation locks' lease TTL; 0 means lockTTL.
	lockTTL time.Duration
}

// resolve returns the ID of lbls from etcd, creating the master key if
// no node uses the labels yet, and writes this node's value key.
func (b *kvBackend) resolve(ctx context.Context, lbls labels.Labels, key string) (identity.NumericIdentity, error) {
	suffix, err := b.suffix(ctx)
	if err != nil {
		return 0, err
	}
	lease, err := b.kv.WaitSession(ctx)
	if err != nil {
		return 0, err
	}
	cli := b.kv.Etcd()
	unlock, err := b.lock(ctx, key)
	if err != nil {
		return 0, err
	}
	defer unlock()

	id, ok, err := b.fromValueKeys(ctx, key)
	if err != nil {
		return 0, err
	}
	if !ok {
		if id, err = b.create(ctx, key); err != nil {
			return 0, err
		}
	}
	if _, err := cli.Put(ctx, kvstore.IdentityValueKey(key, suffix), id.StringID(), clientv3.WithLease(lease)); err != nil {
		return 0, fmt.Errorf("write value key of identity %d: %w", id, err)
	}
	return id, nil
}

// lock takes the allocation lock of the labels key: an etcd mutex under
// kvstore.IdentityLocksPrefix whose key is attached to a lease of its own
// (TTL lockTTL, kept alive while held). It waits for earlier holders; the
// lock of a holder that died without unlocking goes with its lease, so
// it blocks the others for at most lockTTL. unlock releases the lock and
// revokes its lease.
func (b *kvBackend) lock(ctx context.Context, key string) (unlock func(), err error) {
	ttl := b.lockTTL
	if ttl == 0 {
		ttl = lockTTL
	}
	sess, err := concurrency.NewSession(b.kv.Etcd(), concurrency.WithTTL(int(max(ttl/time.Second, 1))), concurrency.WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("kvstore lock session: %w", err)
	}
	mu := concurrency.NewMutex(sess, kvstore.IdentityLocksPrefix+key)
	if err := mu.Lock(ctx); err != nil {
		_ = sess.Close()
		return nil, fmt.Errorf("lock %s (held by another agent's allocation of the same labels; a dead agent's lock expires with its %s lease): %w", kvstore.IdentityLocksPrefix+key, ttl, err)
	}
	return func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = mu.Unlock(uctx)
		_ = sess.Close()
	}, nil
}

// fromValueKeys returns the ID another node uses for key, if its master
// key still holds key. Value keys with garbage are skipped.
func (b *kvBackend) fromValueKeys(ctx context.Context, key string) (identity.NumericIdentity, bool, error) {
	resp, err := b.kv.Etcd().Get(ctx, kvstore.IdentityValueKeysOf(key), clientv3.WithPrefix())
	if err != nil {
		return 0, false, fmt.Errorf("read value keys of %s: %w", key, err)
	}
	for _, kv := range resp.Kvs {
		id, err := identity.ParseNumericIdentity(string(kv.Value))
		if err != nil || id == identity.InvalidIdentity {
			b.log.Warn("Skipping kvstore identity value key with garbage", "key", string(kv.Key))
			continue
		}
		m, err := b.kv.Etcd().Get(ctx, kvstore.IdentityIDKey(id))
		if err != nil {
			return 0, false, fmt.Errorf("read master key of identity %d: %w", id, err)
		}
		if len(m.Kvs) == 1 && string(m.Kvs[0].Value) == key {
			return id, true, nil
		}
	}
	return 0, false, nil
}

// create probes numbers from the labels' deterministic start and creates
// the first free master key. A number whose master key holds the same
// labels is used as it is.
func (b *kvBackend) create(ctx context.Context, key string) (identity.NumericIdentity, error) {
	span := uint64(b.max-b.min) + 1
	start := probeStart(key, span)
	for i := uint64(0); i < span; i++ {
		n := b.min + identity.NumericIdentity((start+i)%span)
		won, cur, err := b.createOnly(ctx, n, key)
		if err != nil {
			return 0, err
		}
		if won || cur == key {
			return n, nil
		}
		if _, valid := kvstore.ParseLabelsKey([]byte(cur)); !valid {
			b.log.Warn("Identity number taken by a kvstore key with garbage; skipping it", "identity", n, "value", strconv.Quote(cur))
		}
	}
	return 0, fmt.Errorf("%w (%d..%d); the operator's identity GC frees unused ones", ErrNoFreeIdentity, b.min, b.max)
}

// createOnly writes master key n = key if it does not exist; else it
// returns the current value.
func (b *kvBackend) createOnly(ctx context.Context, n identity.NumericIdentity, key string) (bool, string, error) {
	k := kvstore.IdentityIDKey(n)
	resp, err := b.kv.Etcd().Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
		Then(clientv3.OpPut(k, key)).
		Else(clientv3.OpGet(k)).Commit()
	if err != nil {
		return false, "", fmt.Errorf("create master key %s: %w", k, err)
	}
	if resp.Succeeded {
		return true, key, nil
	}
	kvs := resp.Responses[0].GetResponseRange().GetKvs()
	if len(kvs) == 0 {
		return false, "", nil
	}
	return false, string(kvs[0].Value), nil
}

// kvOps keeps this node's value key of each allocation in etcd (and the
// master key, should the GC have deleted it while in use).
type kvOps struct {
	b *kvBackend
}

// Update writes the value key with the current lease, re-creating the
// master key if it is gone. ErrIdentityConflict if the number now holds
// other labels.
func (o *kvOps) Update(ctx context.Context, _ statedb.ReadTxn, a *identity.Allocation) error {
	suffix, err := o.b.suffix(ctx)
	if err != nil {
		return err
	}
	lease, _ := o.b.kv.Session()
	if lease == 0 {
		return kvstore.ErrNoSession
	}
	key := a.Labels.SortedList()
	idKey := kvstore.IdentityIDKey(a.ID)
	valKey := kvstore.IdentityValueKey(key, suffix)
	put := clientv3.OpPut(valKey, a.ID.StringID(), clientv3.WithLease(lease))
	resp, err := o.b.kv.Etcd().Txn(ctx).
		If(clientv3.Compare(clientv3.Value(idKey), "=", key)).
		Then(put).
		Else(clientv3.OpGet(idKey)).Commit()
	if err != nil {
		return fmt.Errorf("write value key of identity %d: %w", a.ID, err)
	}
	if resp.Succeeded {
		return nil
	}
	if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) > 0 {
		return fmt.Errorf("kvstore identity %d has labels %q, want %q: %w", a.ID, kvs[0].Value, key, ErrIdentityConflict)
	}
	// Gone (the GC raced with a new user): put it back, same number.
	resp, err = o.b.kv.Etcd().Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(idKey), "=", 0)).
		Then(clientv3.OpPut(idKey, key), put).Commit()
	if err != nil {
		return fmt.Errorf("re-create master key of identity %d: %w", a.ID, err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("master key of identity %d re-created meanwhile; retrying", a.ID)
	}
	o.b.log.Info("Re-created kvstore identity that was deleted while in use", "identity", a.ID, "labels", a.Labels)
	return nil
}

// Delete removes this node's value key: the identity is unused here.
func (o *kvOps) Delete(ctx context.Context, _ statedb.ReadTxn, a *identity.Allocation) error {
	suffix, err := o.b.suffix(ctx)
	if err != nil {
		return err
	}
	if _, err := o.b.kv.Etcd().Delete(ctx, kvstore.IdentityValueKey(a.Labels.SortedList(), suffix)); err != nil {
		return fmt.Errorf("delete value key of identity %d: %w", a.ID, err)
	}
	return nil
}

// Prune deletes this node's value keys of identities it no longer uses
// (left by an earlier run of the agent).
func (o *kvOps) Prune(ctx context.Context, _ statedb.ReadTxn, objs iter.Seq2[*identity.Allocation, statedb.Revision]) error {
	suffix, err := o.b.suffix(ctx)
	if err != nil {
		return err
	}
	want := map[string]bool{}
	for a := range objs {
		want[kvstore.IdentityValueKey(a.Labels.SortedList(), suffix)] = true
	}
	resp, err := o.b.kv.Etcd().Get(ctx, kvstore.IdentityValuePrefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return fmt.Errorf("list value keys: %w", err)
	}
	for _, kv := range resp.Kvs {
		k := string(kv.Key)
		if !strings.HasSuffix(k, "/"+suffix) || want[k] {
			continue
		}
		if _, err := o.b.kv.Etcd().Delete(ctx, k); err != nil {
			return fmt.Errorf("delete stale value key %s: %w", k, err)
		}
		o.b.log.Info("Deleted stale kvstore identity value key of this node", "key", k)
	}
	return nil
}

// reRegisterJob marks every allocation pending when the session lease is
// replaced (the old one expired with its value keys), so the reconciler
// writes them again with the new lease.
func (a *allocator) reRegisterJob() hive.Job {
	return hive.Service("identity-kvstore-reregister", nil, func(ctx context.Context, h hive.Health) {
		first, ch := a.kv.kv.Session()
		prev := first
		for {
			select {
			case <-ctx.Done():
				return
			case <-ch:
			}
			var cur clientv3.LeaseID
			cur, ch = a.kv.kv.Session()
			if cur == 0 || cur == prev {
				continue
			}
			if prev != 0 || first != 0 {
				a.log.Info("kvstore lease replaced; writing this node's identity value keys again")
			}
			prev = cur
			txn := a.db.WriteTxn(a.allocs)
			for row := range a.allocs.All(txn) {
				_, _, _ = a.allocs.Insert(txn, row.With(row.Refs, reconciler.Pending()))
			}
			txn.Commit()
			h.OK("value keys re-registered")
		}
	})
}

// localNodeSuffix is the node suffix of value keys: this node's IPv4
// InternalIP (Cilium's), from the local-node table.
func localNodeSuffix(db *statedb.DB, t statedb.Table[*nodes.LocalNode], name string) func(context.Context) (string, error) {
	return func(ctx context.Context) (string, error) {
		for {
			ip, watch := nodes.LocalInternalIP(db.ReadTxn(), t, name)
			if ip != "" {
				return ip, nil
			}
			select {
			case <-watch:
			case <-ctx.Done():
				return "", fmt.Errorf("node IP for kvstore identity keys not known yet: %w", ctx.Err())
			}
		}
	}
}
