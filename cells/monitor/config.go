package monitor

import (
	"fmt"

	"github.com/spf13/pflag"
)

// Config is the monitor cell's configuration.
type Config struct {
	// MonitorQueueSize is how many events each `cellium monitor` client
	// may fall behind by before the agent drops events for it.
	MonitorQueueSize int
}

// DefaultConfig buffers 4096 events per client.
var DefaultConfig = Config{MonitorQueueSize: 4096}

// Flags registers --monitor-queue-size.
func (def Config) Flags(fs *pflag.FlagSet) {
	fs.Int("monitor-queue-size", def.MonitorQueueSize,
		"Events buffered for each monitor client (cellium monitor) before the agent drops events for a client that reads too slowly")
}

// Validate implements hive.Validator.
func (c Config) Validate() error {
	if c.MonitorQueueSize < 1 {
		return fmt.Errorf("--monitor-queue-size=%d: give the number of events to buffer for each monitor client, at least 1 (default %d)",
			c.MonitorQueueSize, DefaultConfig.MonitorQueueSize)
	}
	return nil
}
