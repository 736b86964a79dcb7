package doctor

import (
	"fmt"
	"time"

	"github.com/spf13/pflag"
)

// Config is the doctor's configuration.
type Config struct {
	// DoctorSettleTime is how long a disagreement must last to be
	// reported: an ADD or DEL in progress makes short-lived ones (an IP
	// allocated before its endpoint exists), so when the first look finds
	// something, the doctor looks again after this long and reports only
	// what both looks found.
	DoctorSettleTime time.Duration
}

// DefaultConfig looks again after 2 seconds, longer than a CNI ADD takes.
var DefaultConfig = Config{DoctorSettleTime: 2 * time.Second}

// Flags registers --doctor-settle-time.
func (def Config) Flags(fs *pflag.FlagSet) {
	fs.Duration("doctor-settle-time", def.DoctorSettleTime,
		"How long a disagreement must last for `cellium doctor` to report it (0: report the first look)")
}

// Validate rejects a negative settle time.
func (c Config) Validate() error {
	if c.DoctorSettleTime < 0 {
		return fmt.Errorf("invalid --doctor-settle-time=%s: must be 0 or more", c.DoctorSettleTime)
	}
	return nil
}
