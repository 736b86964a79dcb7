package k8stest

import (
	"context"
	"sync"
	"testing"

	"github.com/cilium/statedb"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"

	k8stables "github.com/cellium/cellium/statedb/k8s"
)

// Source is the List and Watch of a typed client, such as
// Cilium().CiliumV2().CiliumNodes(); L is its list type.
type Source[L runtime.Object] interface {
	List(ctx context.Context, opts metav1.ListOptions) (L, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

// Mirror copies a resource from api into table, as the k8s resource cells
// do from a real API server (whose reflectors need a REST client the fakes
// have not). It registers an initializer on the table, starts a watch,
// lists and inserts what it found, marks the table initialized once
// initialized is closed, then applies the watch's events. It stops when the
// test ends. A failed List or Watch fails the test.
func Mirror[T k8stables.Object, L runtime.Object](t testing.TB, db *statedb.DB, table statedb.RWTable[T],
	api Source[L], initialized <-chan struct{},
) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	wtxn := db.WriteTxn(table)
	done := table.RegisterInitializer(wtxn, "test-mirror")
	wtxn.Commit()
	w, err := api.Watch(ctx, metav1.ListOptions{})
	if err != nil {
		cancel()
		t.Fatalf("watch %s: %v", table.Name(), err)
	}
	objs, err := list[T](ctx, api)
	if err != nil {
		cancel()
		w.Stop()
		t.Fatalf("list %s: %v", table.Name(), err)
	}
	write := func(fn func(statedb.WriteTxn)) {
		wtxn := db.WriteTxn(table)
		fn(wtxn)
		wtxn.Commit()
	}
	write(func(txn statedb.WriteTxn) {
		for _, o := range objs {
			if _, _, err := table.Insert(txn, o); err != nil {
				t.Errorf("insert into %s: %v", table.Name(), err)
			}
		}
	})
	var wg sync.WaitGroup
	wg.Go(func() {
		select {
		case <-initialized:
			write(done)
		case <-ctx.Done():
		}
	})
	wg.Go(func() {
		for ev := range w.ResultChan() {
			o, ok := ev.Object.(T)
			if !ok {
				continue
			}
			write(func(txn statedb.WriteTxn) {
				var err error
				if ev.Type == watch.Deleted {
					_, _, err = table.Delete(txn, o)
				} else {
					_, _, err = table.Insert(txn, o)
				}
				if err != nil {
					t.Errorf("%s %s: %v", ev.Type, table.Name(), err)
				}
			})
		}
	})
	t.Cleanup(func() {
		cancel()
		w.Stop()
		wg.Wait()
	})
}

// list returns the items of api's list, each pointing into the list.
func list[T k8stables.Object, L runtime.Object](ctx context.Context, api Source[L]) ([]T, error) {
	l, err := api.List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	items, err := meta.ExtractList(l)
	if err != nil {
		return nil, err
	}
	out := make([]T, 0, len(items))
	for _, item := range items {
		o, ok := item.(T)
		if !ok {
			continue
		}
		out = append(out, o)
	}
	return out, nil
}

// Closed returns an already closed channel: passed to Mirror, the table is
// initialized at once.
func Closed() <-chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}
