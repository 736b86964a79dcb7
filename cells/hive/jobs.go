package hive

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/cilium/statedb"
)

// Jobs runs a module's background work. Each added job starts when the
// hive starts and is cancelled and waited for when it stops; its health is
// reported under the module as "job-<name>".
type Jobs interface {
	// Add registers jobs. Call it from constructors and invoked functions.
	Add(jobs ...Job)
}

// Job is background work created by OneShot, Timer or ObserveTable.
type Job interface {
	jobName() string
	run(ctx context.Context, h Health, log *slog.Logger)
}

// preparer is a job that does some work synchronously in the start hook,
// before its goroutine runs (e.g. subscribing to a table's changes so that
// nothing committed after start is missed).
type preparer interface {
	prepare() error
}

// describedJob is a job with a line saying what it does (DescribeJob).
type describedJob struct {
	Job
	detail string
}

// DescribeJob returns job with detail attached: the hive's inventory
// (Hive.Inventory) lists it beside the job's name, e.g. the table and the
// target of a reconciler.
func DescribeJob(job Job, detail string) Job {
	return describedJob{Job: job, detail: detail}
}

func (d describedJob) prepare() error {
	if p, ok := d.Job.(preparer); ok {
		return p.prepare()
	}
	return nil
}

type scopedJobs struct {
	lc     Lifecycle
	health Health
	log    *slog.Logger
}

func (j scopedJobs) Add(jobs ...Job) {
	for _, job := range jobs {
		var (
			cancel context.CancelFunc
			wg     sync.WaitGroup
		)
		name := "job-" + job.jobName()
		h := j.health.Scope(name)
		log := j.log.With("job", job.jobName())
		detail := ""
		if d, ok := job.(describedJob); ok {
			detail = d.detail
		}
		j.lc.Append(Hook{
			Name:   name,
			Detail: detail,
			OnStart: func(context.Context) error {
				if p, ok := job.(preparer); ok {
					if err := p.prepare(); err != nil {
						h.Degraded("start", err)
						return fmt.Errorf("start job %s: %w", name, err)
					}
				}
				var ctx context.Context
				ctx, cancel = context.WithCancel(context.Background())
				wg.Go(func() {
					job.run(ctx, h, log)
				})
				return nil
			},
			OnStop: func(ctx context.Context) error {
				cancel()
				done := make(chan struct{})
				go func() { wg.Wait(); close(done) }()
				select {
				case <-done:
					return nil
				case <-ctx.Done():
					return fmt.Errorf("job %s did not stop: %w", name, ctx.Err())
				}
			},
		})
	}
}

// JobOption tunes a job.
type JobOption func(*jobOptions)

type jobOptions struct {
	retries           int
	minBackoff, maxBk time.Duration
}

// WithRetry makes a one-shot job retry a failed run up to n times (n < 0:
// forever), backing off exponentially from min to max.
func WithRetry(n int, min, max time.Duration) JobOption {
	return func(o *jobOptions) { o.retries, o.minBackoff, o.maxBk = n, min, max }
}

type oneShot struct {
	name string
	fn   func(ctx context.Context, h Health) error
	opts jobOptions
}

// OneShot runs fn once in its own goroutine. fn should return when ctx is
// cancelled. A failure is logged and reported as degraded health, and
// retried if WithRetry is given.
func OneShot(name string, fn func(ctx context.Context, h Health) error, opts ...JobOption) Job {
	j := &oneShot{name: name, fn: fn}
	for _, o := range opts {
		o(&j.opts)
	}
	return j
}

func (j *oneShot) jobName() string { return j.name }

func (j *oneShot) run(ctx context.Context, h Health, log *slog.Logger) {
	backoff := j.opts.minBackoff
	for attempt := 0; ; attempt++ {
		err := j.fn(ctx, h)
		if err == nil || ctx.Err() != nil {
			h.Stopped("done")
			return
		}
		log.Error("job failed", "attempt", attempt+1, "error", err)
		h.Degraded("failed", err)
		if j.opts.retries >= 0 && attempt >= j.opts.retries {
			return
		}
		select {
		case <-ctx.Done():
			h.Stopped("cancelled")
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, j.opts.maxBk)
	}
}

type timer struct {
	name     string
	fn       func(ctx context.Context) error
	interval time.Duration
}

// Timer runs fn every interval (the first run after one interval) until the
// hive stops. Errors are logged and reported as degraded health; the next
// success reports OK again.
func Timer(name string, fn func(ctx context.Context) error, interval time.Duration) Job {
	return &timer{name: name, fn: fn, interval: interval}
}

func (j *timer) jobName() string { return j.name }

func (j *timer) run(ctx context.Context, h Health, log *slog.Logger) {
	t := time.NewTicker(j.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			h.Stopped("stopped")
			return
		case <-t.C:
		}
		if err := j.fn(ctx); err != nil {
			if ctx.Err() != nil {
				continue
			}
			log.Error("timer job failed", "error", err)
			h.Degraded("failed", err)
		} else {
			h.OK(fmt.Sprintf("ran at %s", time.Now().Format(time.RFC3339)))
		}
	}
}

type tableObserver[Obj any] struct {
	changes statedb.ChangeIterator[Obj]
	name    string
	db      *statedb.DB
	table   statedb.Table[Obj]
	fn      func(ctx context.Context, change statedb.Change[Obj]) error
}

// ObserveTable calls fn for every change of a statedb table, starting with
// every object already in it, until the hive stops. An error from fn is
// logged and reported as degraded health; the change is not retried (use a
// reconciler when failures must be retried).
func ObserveTable[Obj any](name string, db *statedb.DB, table statedb.Table[Obj], fn func(ctx context.Context, change statedb.Change[Obj]) error) Job {
	return &tableObserver[Obj]{name: name, db: db, table: table, fn: fn}
}

func (j *tableObserver[Obj]) jobName() string { return j.name }

func (j *tableObserver[Obj]) prepare() error {
	wtxn := j.db.WriteTxn(j.table)
	changes, err := j.table.Changes(wtxn)
	wtxn.Commit()
	if err != nil {
		return fmt.Errorf("subscribe to changes of %s: %w", j.table.Name(), err)
	}
	j.changes = changes
	return nil
}

func (j *tableObserver[Obj]) run(ctx context.Context, h Health, log *slog.Logger) {
	changes := j.changes
	defer changes.Close()
	h.OK("observing " + j.table.Name())
	for {
		seq, watch := changes.Next(j.db.ReadTxn())
		var errs []error
		for change := range seq {
			if err := j.fn(ctx, change); err != nil {
				errs = append(errs, err)
			}
		}
		if err := errors.Join(errs...); err != nil {
			log.Error("observer failed", "error", err)
			h.Degraded("processing changes", err)
		} else {
			h.OK("observing " + j.table.Name())
		}
		select {
		case <-ctx.Done():
			h.Stopped("stopped")
			return
		case <-watch:
		}
	}
}

type service struct {
	name  string
	start func() error
	runFn func(ctx context.Context, h Health)
}

// Service runs a long-lived loop: start (may be nil) runs synchronously in
// the start hook, so that work the loop depends on (a subscription, a
// listener) exists once the hive has started; run then runs in its own
// goroutine until ctx is cancelled at stop. Reconcilers run as services.
func Service(name string, start func() error, run func(ctx context.Context, h Health)) Job {
	return &service{name: name, start: start, runFn: run}
}

func (s *service) jobName() string { return s.name }

func (s *service) prepare() error {
	if s.start == nil {
		return nil
	}
	return s.start()
}

func (s *service) run(ctx context.Context, h Health, _ *slog.Logger) {
	s.runFn(ctx, h)
	h.Stopped("stopped")
}
