package reconciler

import (
	"context"
	"fmt"
	"iter"
	"time"

	"github.com/cilium/statedb"
)

// StatusKind is the reconciliation state of one object.
type StatusKind string

const (
	// StatusPending means the object waits to be reconciled.
	StatusPending StatusKind = "Pending"
	// StatusDone means the target matches the object.
	StatusDone StatusKind = "Done"
	// StatusError means the last attempt failed; it will be retried.
	StatusError StatusKind = "Error"
	// StatusPendingDelete marks a row the reconciler put back into the
	// table because deleting its object from the target failed: the object
	// is not desired any more, the deletion is being retried, and Error
	// says why it failed. The reconciler removes the row once the deletion
	// succeeds. Readers of a desired-state table skip such rows; a writer
	// that wants the object again simply inserts it (the retry stops).
	StatusPendingDelete StatusKind = "PendingDelete"
)

// Status is the reconciliation status kept in each object.
type Status struct {
	Kind      StatusKind `json:"kind"`
	Error     string     `json:"error,omitempty"`
	UpdatedAt time.Time  `json:"updated-at"`
}

// String is "Done", "Pending", "Error: <message>" or
// "PendingDelete: <message>".
func (s Status) String() string {
	if s.Kind == StatusError || s.Kind == StatusPendingDelete {
		return fmt.Sprintf("%s: %s", s.Kind, s.Error)
	}
	return string(s.Kind)
}

// Pending is the status a writer sets on an object it inserts or changes.
func Pending() Status { return Status{Kind: StatusPending, UpdatedAt: time.Now()} }

// Done is the status of a reconciled object.
func Done() Status { return Status{Kind: StatusDone, UpdatedAt: time.Now()} }

// PendingDelete is the status of a row kept because deleting its object
// failed with err.
func PendingDelete(err error) Status {
	return Status{Kind: StatusPendingDelete, Error: err.Error(), UpdatedAt: time.Now()}
}

// Failed is the status of an object whose reconciliation failed with err.
func Failed(err error) Status {
	return Status{Kind: StatusError, Error: err.Error(), UpdatedAt: time.Now()}
}

// Operations applies objects to a target. Update and Delete must be
// idempotent: deleting what does not exist is not an error.
type Operations[Obj any] interface {
	// Update makes the target match obj. txn is the snapshot obj came
	// from, for looking up related objects.
	Update(ctx context.Context, txn statedb.ReadTxn, obj Obj) error
	// Delete removes obj from the target.
	Delete(ctx context.Context, txn statedb.ReadTxn, obj Obj) error
	// Prune removes from the target everything not in desired. It lists
	// the target first, then deletes.
	Prune(ctx context.Context, txn statedb.ReadTxn, desired iter.Seq2[Obj, statedb.Revision]) error
}

// RoundPruner is implemented by targets whose Prune takes long (listing a
// map of 100,000s of entries): the reconciler then prunes with PruneRound
// instead of Prune, a round at a time, and applies the changes that came
// meanwhile (Update, Delete) between the rounds, so that a change waits for
// one round, not the whole prune.
type RoundPruner[Obj any] interface {
	// PruneRound does the next part of a prune in about budget and
	// reports whether the prune is over; the first call after one that
	// reported it over (or failed) starts a new prune, which lists the
	// target first. txn and desired are current at each call: a round
	// must not delete what desired or the Updates since the listing
	// wrote still want. An error ends the prune.
	PruneRound(ctx context.Context, txn statedb.ReadTxn, desired iter.Seq2[Obj, statedb.Revision], budget time.Duration) (done bool, err error)
}

// BatchEntry is one object of a batch and, after the call, its outcome.
type BatchEntry[Obj any] struct {
	Object Obj
	Result error
}

// BatchOperations is implemented by targets that apply many objects in one
// call (BPF map batch updates). When Operations also implements it, the
// reconciler uses it for incremental rounds.
type BatchOperations[Obj any] interface {
	UpdateBatch(ctx context.Context, txn statedb.ReadTxn, batch []BatchEntry[Obj])
	DeleteBatch(ctx context.Context, txn statedb.ReadTxn, batch []BatchEntry[Obj])
}

// Metrics records what the reconciler does. A nil Metrics records nothing.
type Metrics interface {
	// Operation records one Update, Delete or Prune (op) and its outcome.
	Operation(reconciler, op string, duration time.Duration, err error)
	// Errors sets the number of objects currently failing.
	Errors(reconciler string, current int)
}

// Health is where the reconciler reports its state; hive.Health fits.
type Health interface {
	OK(message string)
	Degraded(message string, err error)
}

// Config describes one reconciler.
type Config[Obj any] struct {
	// Name identifies the reconciler in logs, metrics and health.
	Name string
	// Table holds the desired objects.
	Table statedb.RWTable[Obj]
	// GetStatus and SetStatus read and write the Status inside an object.
	// SetStatus must return a copy: objects in a table are immutable.
	GetStatus func(Obj) Status
	SetStatus func(Obj, Status) Obj
	// Operations applies objects to the target.
	Operations Operations[Obj]
	// FullInterval is how often everything is reconciled again and the
	// target pruned; 0 disables periodic full reconciliation (one still
	// runs at start).
	FullInterval time.Duration
	// RetryMin and RetryMax bound the exponential retry backoff.
	// Defaults: 10ms and 30s.
	RetryMin, RetryMax time.Duration
	// Wake and Waits are for objects that wait for something another
	// writer does (a frontend for its backends to be in the backends map):
	// Wake returns a channel that closes when that may have happened (the
	// other table changed); then the objects whose last error Waits
	// reports are retried at once, not after their backoff. Both or
	// neither.
	Wake  func(txn statedb.ReadTxn) <-chan struct{}
	Waits func(err error) bool
	// RoundLimit caps the changes processed per incremental round
	// (default 1000), so status writes are batched and bounded.
	RoundLimit int
	// Metrics may be nil.
	Metrics Metrics
}

func (c *Config[Obj]) validate() error {
	switch {
	case c.Name == "":
		return fmt.Errorf("reconciler config: Name is required")
	case c.Table == nil:
		return fmt.Errorf("reconciler %s: Table is required", c.Name)
	case c.GetStatus == nil || c.SetStatus == nil:
		return fmt.Errorf("reconciler %s: GetStatus and SetStatus are required", c.Name)
	case c.Operations == nil:
		return fmt.Errorf("reconciler %s: Operations is required", c.Name)
	case (c.Wake == nil) != (c.Waits == nil):
		return fmt.Errorf("reconciler %s: Wake and Waits go together", c.Name)
	}
	if c.RetryMin <= 0 {
		c.RetryMin = 10 * time.Millisecond
	}
	if c.RetryMax <= 0 {
		c.RetryMax = 30 * time.Second
	}
	if c.RoundLimit <= 0 {
		c.RoundLimit = 1000
	}
	return nil
}
