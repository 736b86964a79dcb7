package tables

import (
	"context"
	"fmt"
	"strings"

	"github.com/cilium/statedb"
)

// WaitInitialized blocks until every table in ts is initialized (all its
// initializers, such as a Kubernetes reflector's first list, are done) or
// ctx ends. It waits on the tables' watch channels; it never polls.
//
// Possible errors: ctx's error, wrapped with the names of the tables still
// not initialized.
func WaitInitialized(ctx context.Context, db *statedb.DB, ts ...statedb.TableMeta) error {
	for {
		txn := db.ReadTxn()
		var (
			pending []string
			watch   <-chan struct{}
		)
		for _, t := range ts {
			if ok, w := t.Initialized(txn); !ok {
				pending = append(pending, t.Name())
				if watch == nil {
					watch = w
				}
			}
		}
		if len(pending) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for tables %s to be initialized: %w", strings.Join(pending, ", "), ctx.Err())
		case <-watch:
		}
	}
}

// InitWatch returns the watch channel of the first table in ts that is not
// initialized in txn, or nil when all are. A loop selects on it to wake when
// the next table becomes initialized; once all are, the nil channel blocks
// for good instead of the closed one, which would wake the loop forever.
func InitWatch(txn statedb.ReadTxn, ts ...statedb.TableMeta) <-chan struct{} {
	for _, t := range ts {
		if ok, w := t.Initialized(txn); !ok {
			return w
		}
	}
	return nil
}

// Initialized reports whether every table in ts is initialized in txn.
func Initialized(txn statedb.ReadTxn, ts ...statedb.TableMeta) bool {
	for _, t := range ts {
		if ok, _ := t.Initialized(txn); !ok {
			return false
		}
	}
	return true
}
