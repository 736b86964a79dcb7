package hubble

import (
	"fmt"
	"runtime"
	"time"

	"github.com/spf13/pflag"
)

// Config is the flow producer's configuration.
type Config struct {
	// EnableHubble turns datapath events into flows for the sinks (the
	// Observer's ring buffer, Hubble's metrics).
	EnableHubble bool
	// HubbleEventQueueSize is how many datapath events may wait for the
	// flow producer before the monitor hub drops them for it (then
	// reported as a LostEvent); 0 picks 1024 per CPU, at most 16384.
	HubbleEventQueueSize int
	// HubbleLostEventSendInterval bounds how often a LostEvent is sent per
	// source: the losses of an interval are summed into one.
	HubbleLostEventSendInterval time.Duration
}

// DefaultConfig enables Hubble, as a Cilium installation does (its Helm
// chart's hubble.enabled defaults to true), with the queue sized from the
// CPUs.
var DefaultConfig = Config{EnableHubble: true, HubbleLostEventSendInterval: DefaultLostEventSendInterval}

// Event queue sizing when --hubble-event-queue-size is 0 (Cilium's).
const (
	queueSizePerCPU = 1024
	queueSizeMax    = 16384
)

// Flags registers --enable-hubble, --hubble-event-queue-size and
// --hubble-lost-event-send-interval.
func (def Config) Flags(fs *pflag.FlagSet) {
	fs.Bool("enable-hubble", def.EnableHubble, "Enable Hubble: turn datapath events into flows (the Observer API and Hubble metrics read them)")
	fs.Int("hubble-event-queue-size", def.HubbleEventQueueSize,
		"Datapath events buffered for the Hubble flow producer before they are lost (0: 1024 per CPU, at most 16384)")
	fs.Duration("hubble-lost-event-send-interval", def.HubbleLostEventSendInterval,
		"Send at most one LostEvent per source in this interval, counting every event lost in it (0: one for each loss noticed)")
}

// Validate implements hive.Validator.
func (c Config) Validate() error {
	if c.HubbleEventQueueSize < 0 {
		return fmt.Errorf("--hubble-event-queue-size=%d: give the number of events to buffer, or 0 for 1024 per CPU (at most %d)",
			c.HubbleEventQueueSize, queueSizeMax)
	}
	if c.HubbleLostEventSendInterval < 0 {
		return fmt.Errorf("--hubble-lost-event-send-interval=%s: give a duration of 0 or more, such as 1s (the default)", c.HubbleLostEventSendInterval)
	}
	return nil
}

// queueSize is the event queue size the producer subscribes with.
func (c Config) queueSize() int {
	if c.HubbleEventQueueSize > 0 {
		return c.HubbleEventQueueSize
	}
	return min(runtime.NumCPU()*queueSizePerCPU, queueSizeMax)
}
