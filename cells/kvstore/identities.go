package kvstore

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
)

// listTimeout bounds one list of the identities.
const listTimeout = 30 * time.Second

// IdentitiesListerWatcher presents the identity master keys in etcd as
// CiliumIdentity objects (name = number, security-labels = labels,
// resourceVersion = etcd revision), so that the k8s cells' reflector fills
// the CiliumIdentity table from etcd exactly as it does from the API
// server. A key whose number or value is garbage is skipped with a
// warning (and, if it replaced a valid identity, reported as deleted).
func (c *Client) IdentitiesListerWatcher(log *slog.Logger) cache.ListerWatcher {
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, _ metav1.ListOptions) (runtime.Object, error) {
			ctx, cancel := context.WithTimeout(ctx, listTimeout)
			defer cancel()
			resp, err := c.etcd.Get(ctx, IdentityIDPrefix, clientv3.WithPrefix())
			if err != nil {
				return nil, fmt.Errorf("list %s: %w", IdentityIDPrefix, err)
			}
			list := &ciliumv2.CiliumIdentityList{ListMeta: metav1.ListMeta{ResourceVersion: strconv.FormatInt(resp.Header.Revision, 10)}}
			for _, kv := range resp.Kvs {
				if obj, ok := identityObject(log, kv); ok {
					list.Items = append(list.Items, *obj)
				}
			}
			return list, nil
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			rev, err := strconv.ParseInt(o.ResourceVersion, 10, 64)
			if err != nil {
				return nil, apierrors.NewResourceExpired(fmt.Sprintf("resourceVersion %q is not an etcd revision", o.ResourceVersion))
			}
			return newIdentityWatch(ctx, log, c.etcd, rev+1), nil
		},
	}
}

// identityObject converts a master key; false (with a warning) for
// garbage.
func identityObject(log *slog.Logger, kv *mvccpb.KeyValue) (*ciliumv2.CiliumIdentity, bool) {
	id, ok := ParseIdentityIDKey(string(kv.Key))
	if !ok {
		log.Warn("Skipping kvstore identity key with an invalid number", "key", string(kv.Key))
		return nil, false
	}
	lbls, ok := ParseLabelsKey(kv.Value)
	if !ok {
		log.Warn("Skipping kvstore identity key whose value is not a label list", "key", string(kv.Key), "value", truncate(kv.Value))
		return nil, false
	}
	return &ciliumv2.CiliumIdentity{
		ObjectMeta: metav1.ObjectMeta{
			Name:            id.StringID(),
			ResourceVersion: strconv.FormatInt(kv.ModRevision, 10),
		},
		SecurityLabels: lbls.Map(),
	}, true
}

func truncate(b []byte) string {
	if len(b) > 64 {
		return strconv.Quote(string(b[:64])) + "..."
	}
	return strconv.Quote(string(b))
}

// identityWatch translates an etcd watch of the master keys into watch
// events.
type identityWatch struct {
	cancel context.CancelFunc
	out    chan watch.Event
}

func newIdentityWatch(ctx context.Context, log *slog.Logger, cli *clientv3.Client, from int64) *identityWatch {
	ctx, cancel := context.WithCancel(ctx)
	w := &identityWatch{cancel: cancel, out: make(chan watch.Event)}
	wch := cli.Watch(clientv3.WithRequireLeader(ctx), IdentityIDPrefix, clientv3.WithPrefix(), clientv3.WithRev(from), clientv3.WithPrevKV())
	go func() {
		defer close(w.out)
		for resp := range wch {
			if err := resp.Err(); err != nil {
				// Compacted, or no leader: the reflector lists again.
				st := apierrors.NewResourceExpired(fmt.Sprintf("etcd watch of %s: %v", IdentityIDPrefix, err)).Status()
				if resp.CompactRevision == 0 && err != rpctypes.ErrCompacted {
					st = apierrors.NewInternalError(err).Status()
				}
				w.send(ctx, watch.Event{Type: watch.Error, Object: &st})
				return
			}
			for _, ev := range resp.Events {
				if !w.send(ctx, translate(log, ev)) {
					return
				}
			}
		}
	}()
	return w
}

// translate makes the watch event of an etcd event. A put of garbage over
// a valid identity is a deletion; garbage over garbage a no-op deletion.
func translate(log *slog.Logger, ev *clientv3.Event) watch.Event {
	if ev.Type == clientv3.EventTypeDelete {
		id, _ := ParseIdentityIDKey(string(ev.Kv.Key))
		return watch.Event{Type: watch.Deleted, Object: &ciliumv2.CiliumIdentity{ObjectMeta: metav1.ObjectMeta{
			Name: id.StringID(), ResourceVersion: strconv.FormatInt(ev.Kv.ModRevision, 10)}}}
	}
	obj, ok := identityObject(log, ev.Kv)
	if !ok {
		id, _ := ParseIdentityIDKey(string(ev.Kv.Key))
		return watch.Event{Type: watch.Deleted, Object: &ciliumv2.CiliumIdentity{ObjectMeta: metav1.ObjectMeta{
			Name: id.StringID(), ResourceVersion: strconv.FormatInt(ev.Kv.ModRevision, 10)}}}
	}
	if ev.IsCreate() {
		return watch.Event{Type: watch.Added, Object: obj}
	}
	return watch.Event{Type: watch.Modified, Object: obj}
}

func (w *identityWatch) send(ctx context.Context, ev watch.Event) bool {
	select {
	case w.out <- ev:
		return true
	case <-ctx.Done():
		return false
	}
}

// Stop ends the watch.
func (w *identityWatch) Stop() { w.cancel() }

// ResultChan delivers the events; closed when the watch ends.
func (w *identityWatch) ResultChan() <-chan watch.Event { return w.out }
