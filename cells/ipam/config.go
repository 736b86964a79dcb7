package ipam

import (
	"fmt"
	"time"

	"github.com/spf13/pflag"
)

// Config is the IPAM cell's configuration.
type Config struct {
	// IPAMGCGrace is how long a pod address may stay allocated without an
	// endpoint using it before the garbage collector frees it; 0 turns the
	// collector off.
	IPAMGCGrace time.Duration
}

// DefaultConfig frees unused pod addresses after five minutes: longer than
// the CNI plugin's ADD may take (two minutes), so the collector never
// frees the address of an ADD still running.
var DefaultConfig = Config{IPAMGCGrace: 5 * time.Minute}

// Flags registers --ipam-gc-grace.
func (def Config) Flags(fs *pflag.FlagSet) {
	fs.Duration("ipam-gc-grace", def.IPAMGCGrace,
		"Free a pod IP that no endpoint has used for this long (an ADD that died before its rollback, a lost DEL); 0 disables")
}

// minGCGrace keeps the collector away from running ADDs. A shorter grace
// than an ADD takes is still safe (the ADD's claim fails and it rolls
// back) but makes slow ADDs fail.
const minGCGrace = 30 * time.Second

// Validate rejects a grace short enough to race a running ADD.
func (c Config) Validate() error {
	if c.IPAMGCGrace != 0 && c.IPAMGCGrace < minGCGrace {
		return fmt.Errorf("--ipam-gc-grace=%s is too short: use 0 (off) or at least %s; values above the CNI plugin's ADD timeout (2m) never race a running ADD", c.IPAMGCGrace, minGCGrace)
	}
	return nil
}

// gcInterval is how often the collector looks for unused addresses.
func (c Config) gcInterval() time.Duration {
	return min(max(c.IPAMGCGrace/4, time.Second), time.Minute)
}
