package endpointgc

import (
	"fmt"
	"time"

	"github.com/spf13/pflag"
)

// FlagInterval is the flag of Config.CiliumEndpointGCInterval (Cilium's name).
const FlagInterval = "cilium-endpoint-gc-interval"

// Config is the collector's configuration.
type Config struct {
	// CiliumEndpointGCInterval is the time between passes; 0 disables the
	// collector.
	CiliumEndpointGCInterval time.Duration
}

// DefaultConfig runs a pass every 5 minutes, as Cilium does.
var DefaultConfig = Config{CiliumEndpointGCInterval: 5 * time.Minute}

// Flags registers --cilium-endpoint-gc-interval.
func (def Config) Flags(fs *pflag.FlagSet) {
	fs.Duration(FlagInterval, def.CiliumEndpointGCInterval,
		"GC interval for CiliumEndpoints whose pod is gone or finished (0 disables the GC)")
}

// Validate rejects a negative interval.
func (c Config) Validate() error {
	if c.CiliumEndpointGCInterval < 0 {
		return fmt.Errorf("invalid --%s=%s: must be 0 (disabled) or positive", FlagInterval, c.CiliumEndpointGCInterval)
	}
	return nil
}
