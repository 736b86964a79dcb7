package leaderelection

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/k8s"
)

// LeaderJob is a controller that runs only on the leader. Run is called
// when leadership is won and its ctx is cancelled when it ends; an error
// is logged and Run is called again after a backoff.
type LeaderJob struct {
	Name string
	Run  func(ctx context.Context) error
}

// LeaderJobsOut contributes leader jobs from a constructor.
type LeaderJobsOut struct {
	hive.Out
	Jobs []LeaderJob `group:"leader-jobs,flatten"`
}

// Leadership reports whether this replica leads.
type Leadership interface {
	// IsLeader is true while this replica holds the Lease (always true
	// with --leader-election=false once started).
	IsLeader() bool
	// Identity is this replica's name in the Lease.
	Identity() string
}

type elector struct {
	leader   atomic.Bool
	identity string
}

func (e *elector) IsLeader() bool   { return e.leader.Load() }
func (e *elector) Identity() string { return e.identity }

func newElector() *elector {
	host, _ := os.Hostname()
	return &elector{identity: fmt.Sprintf("%s_%s", host, rand.String(8))}
}

func leadership(e *elector) Leadership { return e }

type electionParams struct {
	hive.In
	Config     Config
	Elector    *elector
	Clientset  k8s.Clientset
	Jobs       hive.Jobs
	Log        *slog.Logger
	Shutdowner hive.Shutdowner
	LeaderJobs []LeaderJob `group:"leader-jobs"`
}

func registerElection(p electionParams) {
	p.Jobs.Add(hive.Service("leader-election", nil, func(ctx context.Context, h hive.Health) {
		if !p.Config.LeaderElection {
			p.Elector.leader.Store(true)
			h.OK("leader election disabled: acting as leader")
			runLeaderJobs(ctx, p.LeaderJobs, p.Log)
			return
		}
		if !p.Clientset.IsEnabled() {
			h.Degraded("cannot elect a leader", k8s.ErrNotConfigured)
			return
		}
		lock := &resourcelock.LeaseLock{
			LeaseMeta:  metaFor(p.Config),
			Client:     p.Clientset.CoordinationV1(),
			LockConfig: resourcelock.ResourceLockConfig{Identity: p.Elector.identity},
		}
		h.OK("candidate")
		leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
			Lock:            lock,
			LeaseDuration:   p.Config.LeaderElectionLeaseDuration,
			RenewDeadline:   p.Config.LeaderElectionRenewDeadline,
			RetryPeriod:     p.Config.LeaderElectionRetryPeriod,
			ReleaseOnCancel: true,
			Name:            LeaseName,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(ctx context.Context) {
					p.Elector.leader.Store(true)
					p.Log.Info("leading", "identity", p.Elector.identity)
					h.OK("leading")
					runLeaderJobs(ctx, p.LeaderJobs, p.Log)
				},
				OnStoppedLeading: func() {
					p.Elector.leader.Store(false)
					if ctx.Err() != nil {
						return // stopping: the lease was released
					}
					// Another replica may already run the controllers:
					// stop, and let the restart rejoin as a candidate.
					p.Log.Error("leadership lost, shutting down")
					h.Degraded("leadership lost", fmt.Errorf("lease %s lost", LeaseName))
					_ = p.Shutdowner.Shutdown(hive.ExitCode(1))
				},
				OnNewLeader: func(id string) {
					if id != p.Elector.identity {
						p.Log.Info("another replica leads", "leader", id)
					}
				},
			},
		})
	}))
}

// runLeaderJobs runs every job until ctx ends, restarting failed ones.
func runLeaderJobs(ctx context.Context, jobs []LeaderJob, log *slog.Logger) {
	var wg sync.WaitGroup
	for _, j := range jobs {
		wg.Go(func() {
			backoff := 100 * time.Millisecond
			for ctx.Err() == nil {
				if err := j.Run(ctx); err != nil && ctx.Err() == nil {
					log.Error("leader job failed", "job", j.Name, "error", err)
					select {
					case <-ctx.Done():
					case <-time.After(backoff):
					}
					backoff = min(backoff*2, 30*time.Second)
					continue
				}
				if ctx.Err() == nil {
					<-ctx.Done() // finished: nothing to do until leadership ends
				}
			}
		})
	}
	wg.Wait()
}
