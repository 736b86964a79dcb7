package leaderelection

import (
	"fmt"
	"time"

	"github.com/spf13/pflag"
)

// LeaseName is the Lease the operator replicas compete for.
const LeaseName = "cellium-operator-resource-lock"

// Config is the election's configuration (Cilium's flag names for the
// timings).
type Config struct {
	LeaderElection              bool
	LeaderElectionNamespace     string
	LeaderElectionLeaseDuration time.Duration
	LeaderElectionRenewDeadline time.Duration
	LeaderElectionRetryPeriod   time.Duration
}

// DefaultConfig elects a leader with Cilium's timings.
var DefaultConfig = Config{
	LeaderElection:              true,
	LeaderElectionNamespace:     "kube-system",
	LeaderElectionLeaseDuration: 15 * time.Second,
	LeaderElectionRenewDeadline: 10 * time.Second,
	LeaderElectionRetryPeriod:   2 * time.Second,
}

// Flags registers the election flags.
func (def Config) Flags(fs *pflag.FlagSet) {
	fs.Bool("leader-election", def.LeaderElection, "Elect a leader among operator replicas; only the leader runs the controllers")
	fs.String("leader-election-namespace", def.LeaderElectionNamespace, "Namespace of the leader election Lease")
	fs.Duration("leader-election-lease-duration", def.LeaderElectionLeaseDuration, "Duration that non-leader candidates wait before forcing to acquire leadership")
	fs.Duration("leader-election-renew-deadline", def.LeaderElectionRenewDeadline, "Duration that the current leader retries refreshing leadership before giving up the lock")
	fs.Duration("leader-election-retry-period", def.LeaderElectionRetryPeriod, "Duration candidates wait between tries of actions")
}

// Validate checks the timings client-go requires.
func (c Config) Validate() error {
	if !c.LeaderElection {
		return nil
	}
	if c.LeaderElectionLeaseDuration <= c.LeaderElectionRenewDeadline {
		return fmt.Errorf("invalid --leader-election-lease-duration=%s: must be greater than --leader-election-renew-deadline=%s",
			c.LeaderElectionLeaseDuration, c.LeaderElectionRenewDeadline)
	}
	if c.LeaderElectionRetryPeriod <= 0 || c.LeaderElectionRenewDeadline <= c.LeaderElectionRetryPeriod {
		return fmt.Errorf("invalid --leader-election-retry-period=%s: must be greater than 0 and less than --leader-election-renew-deadline", c.LeaderElectionRetryPeriod)
	}
	return nil
}
