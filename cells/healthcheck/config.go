package healthcheck

import (
	"fmt"
	"time"

	"github.com/spf13/pflag"
)

// Config is the node prober's configuration.
type Config struct {
	// HealthCheckInterval is how often every path to every other node is
	// probed.
	HealthCheckInterval time.Duration
}

// DefaultConfig probes every 10 seconds. Cilium's cilium-health probes
// every 60 s and more rarely in large clusters; cellium probes more often
// so that a cut link shows within two intervals, 20 s, which a test can
// wait for: three small probes per node per interval cost little at the
// cluster sizes cellium runs.
var DefaultConfig = Config{HealthCheckInterval: DefaultInterval}

// Flags registers --health-check-interval.
func (def Config) Flags(fs *pflag.FlagSet) {
	fs.Duration("health-check-interval", def.HealthCheckInterval,
		"How often the agent probes every other node's address (ICMP) and health endpoint (ICMP and GET /hello on port 4240)")
}

// Validate rejects an interval below one second.
func (c Config) Validate() error {
	if c.HealthCheckInterval < time.Second {
		return fmt.Errorf("invalid --health-check-interval=%s: must be 1s or more", c.HealthCheckInterval)
	}
	return nil
}
