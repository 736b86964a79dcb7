package cesbatcher

import (
	"fmt"

	"github.com/spf13/pflag"
)

// The flags (Cilium's operator names).
const (
	FlagMaxCEPsInCES = "ces-max-ciliumendpoints-per-ces"
	FlagSliceMode    = "ces-slice-mode"
	// FlagRateLimits is Cilium v1.20's write rate by cluster size: a
	// JSON list of steps (see RateLimits).
	FlagRateLimits = "ces-rate-limits"
	// FlagWriteQPS and FlagWriteBurst are Cilium 1.18's fixed write rate,
	// deprecated: set, they mean the one step
	// [{"nodes":0,"limit":QPS,"burst":BURST}].
	FlagWriteQPS   = "ces-write-qps-limit"
	FlagWriteBurst = "ces-write-qps-burst"
)

// SliceModeIdentity batches endpoints by namespace and identity, the
// only mode cellium has (Cilium's default up to 1.18).
const SliceModeIdentity = "identity"

// The largest write rate and burst of a step, as Cilium documents them.
const (
	MaxWriteQPS   = 50
	MaxWriteBurst = 100
)

// DefaultRateLimits is --ces-rate-limits' default, Cilium's: 10 writes a
// second, bursts of 20, whatever the cluster's size.
const DefaultRateLimits = `[{"nodes":0,"limit":10,"burst":20}]`

// ChartRateLimits is the Helm chart's default ciliumEndpointSlice.rateLimits
// (Cilium's) as the chart renders it into --ces-rate-limits: from 100
// nodes on, 50 writes a second and bursts of 100.
const ChartRateLimits = `[{"burst":20,"limit":10,"nodes":0},{"burst":100,"limit":50,"nodes":100}]`

// The deprecated flags' defaults (Cilium 1.18's), used for the one of
// them that is not set when the other is.
const (
	deprecatedDefaultQPS   = 10
	deprecatedDefaultBurst = 20
)

// Config is the batcher's configuration.
type Config struct {
	// CESMaxCiliumendpointsPerCES is the most entries a slice holds.
	CESMaxCiliumendpointsPerCES int
	// CESSliceMode is how endpoints are grouped: identity.
	CESSliceMode string
	// CESRateLimits bounds the slice writes (create, update, delete) per
	// second by the number of CiliumNodes: a JSON list of steps.
	CESRateLimits string
	// CESWriteQPSLimit and CESWriteQPSBurst are the deprecated fixed
	// rate; they count only when given (WriteQPSLimitSet,
	// WriteQPSBurstSet).
	CESWriteQPSLimit float64
	CESWriteQPSBurst int

	// Whether --ces-rate-limits, --ces-write-qps-limit and
	// --ces-write-qps-burst were given.
	RateLimitsSet    bool `changed:"ces-rate-limits"`
	WriteQPSLimitSet bool `changed:"ces-write-qps-limit"`
	WriteQPSBurstSet bool `changed:"ces-write-qps-burst"`
}

// DefaultConfig has Cilium's defaults.
var DefaultConfig = Config{
	CESMaxCiliumendpointsPerCES: 100,
	CESSliceMode:                SliceModeIdentity,
	CESRateLimits:               DefaultRateLimits,
	CESWriteQPSLimit:            deprecatedDefaultQPS,
	CESWriteQPSBurst:            deprecatedDefaultBurst,
}

// Flags registers the batcher's flags.
func (def Config) Flags(fs *pflag.FlagSet) {
	fs.Int(FlagMaxCEPsInCES, def.CESMaxCiliumendpointsPerCES, "Maximum number of CiliumEndpoints in one CiliumEndpointSlice")
	fs.String(FlagSliceMode, def.CESSliceMode, "How CiliumEndpoints are grouped into CiliumEndpointSlices: identity (by namespace and security identity; the only mode)")
	fs.String(FlagRateLimits, def.CESRateLimits, fmt.Sprintf(
		`CiliumEndpointSlice writes to the API server by cluster size: a JSON list of steps {"nodes":N,"limit":L,"burst":B}; `+
			`the step with the largest nodes not above the number of CiliumNodes applies (the smallest one below it); limit at most %d, burst at most %d`,
		MaxWriteQPS, MaxWriteBurst))
	fs.Float64(FlagWriteQPS, def.CESWriteQPSLimit, "CiliumEndpointSlice writes per second (deprecated)")
	fs.Int(FlagWriteBurst, def.CESWriteQPSBurst, "Burst of CiliumEndpointSlice writes (deprecated)")
	deprecated := fmt.Sprintf(`use --%s='[{"nodes":0,"limit":QPS,"burst":BURST}]'`, FlagRateLimits)
	_ = fs.MarkDeprecated(FlagWriteQPS, deprecated)
	_ = fs.MarkDeprecated(FlagWriteBurst, deprecated)
}

// Validate checks the values.
func (c Config) Validate() error {
	if c.CESMaxCiliumendpointsPerCES <= 0 {
		return fmt.Errorf("invalid --%s=%d: must be positive", FlagMaxCEPsInCES, c.CESMaxCiliumendpointsPerCES)
	}
	if c.CESSliceMode != SliceModeIdentity {
		return fmt.Errorf("invalid --%s=%q: cellium batches only by identity; use --%s=%s (Cilium's fcfs mode is not implemented)",
			FlagSliceMode, c.CESSliceMode, FlagSliceMode, SliceModeIdentity)
	}
	_, err := c.RateLimits()
	return err
}

// RateLimits returns the steps of the write rate: --ces-rate-limits, or
// the one step the deprecated --ces-write-qps-limit and
// --ces-write-qps-burst make when either is given.
func (c Config) RateLimits() (RateLimits, error) {
	if !c.WriteQPSLimitSet && !c.WriteQPSBurstSet {
		return ParseRateLimits(c.CESRateLimits)
	}
	if c.RateLimitsSet {
		return nil, fmt.Errorf("the deprecated --%s and --%s cannot be combined with --%s: set only --%s",
			FlagWriteQPS, FlagWriteBurst, FlagRateLimits, FlagRateLimits)
	}
	step := RateLimit{Nodes: 0, Limit: deprecatedDefaultQPS, Burst: deprecatedDefaultBurst}
	if c.WriteQPSLimitSet {
		step.Limit = c.CESWriteQPSLimit
	}
	if c.WriteQPSBurstSet {
		step.Burst = c.CESWriteQPSBurst
	}
	if step.Limit <= 0 || step.Limit > MaxWriteQPS {
		return nil, fmt.Errorf("invalid --%s=%v: must be greater than 0 and at most %d", FlagWriteQPS, step.Limit, MaxWriteQPS)
	}
	if step.Burst <= 0 || step.Burst > MaxWriteBurst {
		return nil, fmt.Errorf("invalid --%s=%d: must be greater than 0 and at most %d", FlagWriteBurst, step.Burst, MaxWriteBurst)
	}
	return RateLimits{step}, nil
}
