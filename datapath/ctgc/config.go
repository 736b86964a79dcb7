package ctgc

import (
	"fmt"
	"time"

	"github.com/spf13/pflag"
)

// FlagInterval is the flag of Config.Interval (Cilium's name).
const FlagInterval = "conntrack-gc-interval"

// DefaultInterval is the time between passes when --conntrack-gc-interval
// is 0. Cilium then picks an interval from how much each pass deletes;
// cellium keeps a fixed one, short enough that a map filled by a burst of
// short connections is emptied again within 30s of their deadlines.
const DefaultInterval = 30 * time.Second

// Config is the collector's configuration.
type Config struct {
	// Interval is the time between passes; 0 is DefaultInterval.
	Interval time.Duration `flag:"conntrack-gc-interval"`
}

// DefaultConfig lets the agent choose the interval, as Cilium's default
// does.
var DefaultConfig = Config{}

// Flags registers --conntrack-gc-interval.
func (def Config) Flags(fs *pflag.FlagSet) {
	fs.Duration(FlagInterval, def.Interval,
		"Time between garbage collections of the conntrack map's expired entries (0: "+DefaultInterval.String()+")")
}

// Validate rejects a negative interval.
func (c Config) Validate() error {
	if c.Interval < 0 {
		return fmt.Errorf("invalid --%s=%s: must be 0 (the default, %s) or positive", FlagInterval, c.Interval, DefaultInterval)
	}
	return nil
}

// EffectiveInterval is the time between passes.
func (c Config) EffectiveInterval() time.Duration {
	if c.Interval == 0 {
		return DefaultInterval
	}
	return c.Interval
}
