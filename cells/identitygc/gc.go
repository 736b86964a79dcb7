package identitygc

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"maps"
	"time"

	"github.com/cilium/statedb"
	k8serrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/flowcontrol"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	ciliumclient "github.com/cellium/cellium/api/client/clientset/versioned/typed/cilium.io/v2"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/statedb/identity"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/tables"
)

// Tables are what the collector decides from. Both must be initialized
// (fully listed) before it acts.
type Tables struct {
	DB         *statedb.DB
	Identities statedb.Table[*ciliumv2.CiliumIdentity]
	Endpoints  statedb.Table[*ciliumv2.CiliumEndpoint]
}

// GC deletes CiliumIdentities no CiliumEndpoint uses. It is the body of
// the cell's leader job; NewGC makes one without a hive.
type GC struct {
	cfg     Config
	client  ciliumclient.CiliumIdentityInterface
	tables  Tables
	log     *slog.Logger
	health  hive.Health
	now     func() time.Time
	limiter flowcontrol.RateLimiter
}

// NewGC returns a collector with cfg's timings (validated by the caller,
// see Config.Validate) that writes through client.
func NewGC(cfg Config, client ciliumclient.CiliumIdentityInterface, tables Tables, log *slog.Logger, health hive.Health) *GC {
	limit := min(max(cfg.IdentityGCRateLimit, 1), 1<<30)
	return &GC{
		cfg: cfg, client: client, tables: tables, log: log, health: health, now: time.Now,
		limiter: flowcontrol.NewTokenBucketRateLimiter(float32(float64(limit)/cfg.IdentityGCRateInterval.Seconds()), int(limit)),
	}
}

// Run waits until the CiliumIdentities and CiliumEndpoints tables are
// initialized, then runs a pass at once and one every interval until ctx
// is cancelled. Between passes it follows the CiliumIdentities table: an
// identity created or changed by someone else counts as used at that time.
// It returns nil when ctx ends, or an error if it cannot watch the table.
func (g *GC) Run(ctx context.Context) error {
	defer g.health.Stopped("not leading")
	g.health.OK("waiting for the CiliumIdentities and CiliumEndpoints tables")
	if err := tables.WaitInitialized(ctx, g.tables.DB, g.tables.Identities, g.tables.Endpoints); err != nil {
		return nil // cancelled
	}
	wtxn := g.tables.DB.WriteTxn(g.tables.Identities)
	changes, err := g.tables.Identities.Changes(wtxn)
	wtxn.Commit()
	if err != nil {
		return fmt.Errorf("watch %s: %w", g.tables.Identities.Name(), err)
	}
	defer changes.Close()

	t := g.newTerm()
	ticker := time.NewTicker(g.cfg.IdentityGCInterval)
	defer ticker.Stop()
	due := true
	for {
		// The first batch is every identity in the table: each counts as
		// used now, when this replica starts leading.
		seq, watch := changes.Next(g.tables.DB.ReadTxn())
		t.observe(seq)
		if due {
			due = false
			res := t.pass(ctx)
			if ctx.Err() != nil {
				return nil
			}
			g.report(res)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-watch:
		case <-ticker.C:
			due = true
		}
	}
}

func (g *GC) report(res passResult) {
	if res.err != nil {
		g.log.Error("identity GC pass failed", "error", res.err)
		g.health.Degraded("collecting unused identities", res.err)
		return
	}
	g.health.OK(fmt.Sprintf("last pass at %s: %d identities, %d in use, %d marked, %d deleted",
		g.now().Format(time.RFC3339), res.checked, res.used, res.marked, res.deleted))
}

// term is the collector's memory during one leadership term; only Run's
// goroutine uses it.
type term struct {
	*GC
	// heartbeats is the last time each identity was seen in use, or
	// created or changed by someone else.
	heartbeats map[string]time.Time
	// marks holds the resourceVersion our mark gave an identity, to tell
	// our own change from others'.
	marks map[string]string
}

func (g *GC) newTerm() *term {
	return &term{GC: g, heartbeats: map[string]time.Time{}, marks: map[string]string{}}
}

// observe records the changes of the CiliumIdentities table.
func (t *term) observe(changes iter.Seq2[statedb.Change[*ciliumv2.CiliumIdentity], statedb.Revision]) {
	now := t.now()
	for ch := range changes {
		name := ch.Object.Name
		switch {
		case ch.Deleted:
			delete(t.heartbeats, name)
			delete(t.marks, name)
		case t.marks[name] != "" && t.marks[name] == ch.Object.ResourceVersion:
			// Our own mark: not a sign of use.
		default:
			t.heartbeats[name] = now
			delete(t.marks, name)
		}
	}
}

// passResult counts what one pass did.
type passResult struct {
	checked, used, marked, unmarked, deleted int
	err                                      error
}

// pass marks the identities unused for a heartbeat timeout, deletes the
// ones marked before and still unused, and unmarks the used ones.
func (t *term) pass(ctx context.Context) passResult {
	var (
		res        passResult
		errs       []error
		candidates []*ciliumv2.CiliumIdentity
	)
	now := t.now()
	txn := t.tables.DB.ReadTxn()
	used := usedIdentities(txn, t.tables.Endpoints)
	for cid := range t.tables.Identities.All(txn) {
		id, ok := collectable(cid.Name)
		if !ok {
			continue
		}
		res.checked++
		_, marked := cid.Annotations[ciliumv2.HeartbeatAnnotation]
		switch last, seen := t.heartbeats[cid.Name]; {
		case used[id]:
			res.used++
			t.heartbeats[cid.Name] = now
			if marked {
				if err := t.unmark(ctx, cid); err != nil {
					errs = append(errs, err)
				} else {
					res.unmarked++
				}
			}
		case !seen:
			t.heartbeats[cid.Name] = now
		case now.Sub(last) < t.cfg.IdentityHeartbeatTimeout:
		case !marked:
			if err := t.mark(ctx, cid, now); err != nil {
				errs = append(errs, err)
			} else {
				res.marked++
			}
		default:
			candidates = append(candidates, cid)
		}
	}
	if len(candidates) > 0 {
		// Check again against the newest state before deleting.
		txn = t.tables.DB.ReadTxn()
		used = usedIdentities(txn, t.tables.Endpoints)
		for _, cid := range candidates {
			cur, _, ok := t.tables.Identities.Get(txn, k8stables.NameIndex[*ciliumv2.CiliumIdentity]().Query(cid.Name))
			if id, _ := collectable(cid.Name); !ok || cur.ResourceVersion != cid.ResourceVersion || used[id] {
				continue // gone, changed or used: the next pass decides
			}
			if err := t.limiter.Wait(ctx); err != nil {
				errs = append(errs, fmt.Errorf("wait for the deletion rate limit (--%s): %w", FlagRateLimit, err))
				break
			}
			deleted, err := t.delete(ctx, cid)
			if err != nil {
				errs = append(errs, err)
			} else if deleted {
				res.deleted++
			}
		}
	}
	res.err = errors.Join(errs...)
	return res
}

// usedIdentities returns the identities some CiliumEndpoint has in
// status.identity.id.
func usedIdentities(txn statedb.ReadTxn, endpoints statedb.Table[*ciliumv2.CiliumEndpoint]) map[identity.NumericIdentity]bool {
	used := map[identity.NumericIdentity]bool{}
	for cep := range endpoints.All(txn) {
		if id := cep.Status.Identity; id != nil && id.ID > 0 && id.ID <= 0xFFFFFFFF {
			used[identity.NumericIdentity(id.ID)] = true
		}
	}
	return used
}

// collectable parses a CiliumIdentity name and reports whether the GC
// manages it: a cluster-wide identity (256 and up, global scope) in
// canonical decimal form.
func collectable(name string) (identity.NumericIdentity, bool) {
	id, err := identity.ParseNumericIdentity(name)
	if err != nil || id.StringID() != name {
		return 0, false
	}
	return id, id >= identity.MinimalNumericIdentity && id.Scope() == identity.IdentityScopeGlobal
}

// mark sets the heartbeat annotation on an unused identity.
func (t *term) mark(ctx context.Context, cid *ciliumv2.CiliumIdentity, now time.Time) error {
	next := cid.DeepCopy()
	if next.Annotations == nil {
		next.Annotations = map[string]string{}
	}
	next.Annotations[ciliumv2.HeartbeatAnnotation] = now.UTC().Format(time.RFC3339Nano)
	updated, err := t.client.Update(ctx, next, metav1.UpdateOptions{})
	switch {
	case k8serrors.IsConflict(err) || k8serrors.IsNotFound(err):
		return nil // changed or gone: the next pass decides
	case err != nil:
		return fmt.Errorf("mark unused CiliumIdentity %s: %w", cid.Name, err)
	}
	t.marks[cid.Name] = updated.ResourceVersion
	t.log.Info("marked unused identity for deletion", "identity", cid.Name,
		"unused-for-at-least", now.Sub(t.heartbeats[cid.Name]).Truncate(time.Second))
	return nil
}

// unmark removes the heartbeat annotation from an identity in use.
func (t *term) unmark(ctx context.Context, cid *ciliumv2.CiliumIdentity) error {
	next := cid.DeepCopy()
	next.Annotations = maps.Clone(cid.Annotations)
	delete(next.Annotations, ciliumv2.HeartbeatAnnotation)
	_, err := t.client.Update(ctx, next, metav1.UpdateOptions{})
	switch {
	case k8serrors.IsConflict(err) || k8serrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("unmark CiliumIdentity %s, in use again: %w", cid.Name, err)
	}
	delete(t.marks, cid.Name)
	t.log.Info("identity in use again, removed its deletion mark", "identity", cid.Name)
	return nil
}

// delete deletes a marked identity unless it changed since it was read.
func (t *term) delete(ctx context.Context, cid *ciliumv2.CiliumIdentity) (bool, error) {
	uid, rv := cid.UID, cid.ResourceVersion
	err := t.client.Delete(ctx, cid.Name, metav1.DeleteOptions{
		Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv},
	})
	switch {
	case k8serrors.IsConflict(err) || k8serrors.IsNotFound(err):
		// Unmarked by an agent that uses it again, re-created, or gone.
		return false, nil
	case err != nil:
		return false, fmt.Errorf("delete unused CiliumIdentity %s: %w", cid.Name, err)
	}
	t.log.Info("deleted unused identity", "identity", cid.Name, "labels", cid.SecurityLabels)
	return true, nil
}
