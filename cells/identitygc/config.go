package identitygc

import (
	"fmt"
	"time"

	"github.com/spf13/pflag"
)

// Flag names (Cilium's).
const (
	FlagInterval         = "identity-gc-interval"
	FlagHeartbeatTimeout = "identity-heartbeat-timeout"
	FlagRateInterval     = "identity-gc-rate-interval"
	FlagRateLimit        = "identity-gc-rate-limit"
)

// The --identity-allocation-mode values (the agent's, cells/identity).
const (
	modeCRD                    = "crd"
	modeKVStore                = "kvstore"
	modeDoubleWriteReadCRD     = "doublewrite-readcrd"
	modeDoubleWriteReadKVStore = "doublewrite-readkvstore"
)

// Config is the collector's configuration.
type Config struct {
	// IdentityGCInterval is the time between passes.
	IdentityGCInterval time.Duration
	// IdentityHeartbeatTimeout is how long an identity must be unused
	// before it is marked; the next pass deletes it if still unused.
	IdentityHeartbeatTimeout time.Duration
	// IdentityGCRateInterval and IdentityGCRateLimit bound the deletions:
	// at most IdentityGCRateLimit per IdentityGCRateInterval.
	IdentityGCRateInterval time.Duration
	IdentityGCRateLimit    int64
	// IdentityAllocationMode says where the identities are: "crd"
	// (CiliumIdentity objects), "kvstore" (etcd, with --kvstore=etcd), or
	// both (the double-write modes: both are collected).
	IdentityAllocationMode string
}

// DefaultConfig has Cilium's defaults: a pass every 15 minutes, deletion
// after 30 minutes unused, at most 2500 deletions a minute.
var DefaultConfig = Config{
	IdentityGCInterval:       15 * time.Minute,
	IdentityHeartbeatTimeout: 30 * time.Minute,
	IdentityGCRateInterval:   time.Minute,
	IdentityGCRateLimit:      2500,
	IdentityAllocationMode:   "crd",
}

// Flags registers the collector's flags.
func (def Config) Flags(fs *pflag.FlagSet) {
	fs.Duration(FlagInterval, def.IdentityGCInterval, "GC interval for security identities")
	fs.Duration(FlagHeartbeatTimeout, def.IdentityHeartbeatTimeout,
		"Time an identity must be unused before it is marked for deletion; a later pass deletes it if it is still unused")
	fs.Duration(FlagRateInterval, def.IdentityGCRateInterval, "Interval used for rate limiting the GC of identities")
	fs.Int64(FlagRateLimit, def.IdentityGCRateLimit, "Maximum number of identities deleted per --"+FlagRateInterval)
	fs.String("identity-allocation-mode", def.IdentityAllocationMode, `Where identities are stored: "crd" (CiliumIdentity objects), "kvstore" (etcd; needs --kvstore=etcd), or while migrating "doublewrite-readcrd" or "doublewrite-readkvstore" (both; needs --kvstore=etcd)`)
}

// Validate requires every value to be positive.
func (c Config) Validate() error {
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{
		{FlagInterval, c.IdentityGCInterval},
		{FlagHeartbeatTimeout, c.IdentityHeartbeatTimeout},
		{FlagRateInterval, c.IdentityGCRateInterval},
	} {
		if d.v <= 0 {
			return fmt.Errorf("invalid --%s=%s: must be positive", d.flag, d.v)
		}
	}
	switch c.IdentityAllocationMode {
	case modeCRD, modeKVStore, modeDoubleWriteReadCRD, modeDoubleWriteReadKVStore:
	default:
		return fmt.Errorf("invalid --identity-allocation-mode=%q: use %q, %q, %q or %q",
			c.IdentityAllocationMode, modeCRD, modeKVStore, modeDoubleWriteReadCRD, modeDoubleWriteReadKVStore)
	}
	if c.IdentityGCRateLimit <= 0 {
		return fmt.Errorf("invalid --%s=%d: must be positive", FlagRateLimit, c.IdentityGCRateLimit)
	}
	return nil
}
