package cesbatcher

import (
	"fmt"

	"github.com/spf13/pflag"
)

// The flags (Cilium's operator names).
const (
	FlagMaxCEPsInCES = "ces-max-ciliumendpoints-per-ces"
	FlagSliceMode    = "ces-slice-mode"
	FlagWriteQPS     = "ces-write-qps-limit"
	FlagWriteBurst   = "ces-write-qps-burst"
)

// SliceModeIdentity batches endpoints by namespace and identity, the
// only mode cellium has (Cilium's default).
const SliceModeIdentity = "identity"

// The largest write rate and burst accepted, as in Cilium.
const (
	MaxWriteQPS   = 50
	MaxWriteBurst = 100
)

// Config is the batcher's configuration.
type Config struct {
	// CESMaxCiliumendpointsPerCES is the most entries a slice holds.
	CESMaxCiliumendpointsPerCES int
	// CESSliceMode is how endpoints are grouped: identity.
	CESSliceMode string
	// CESWriteQPSLimit and CESWriteQPSBurst bound the slice writes
	// (create, update, delete) per second.
	CESWriteQPSLimit float64
	CESWriteQPSBurst int
}

// DefaultConfig has Cilium's defaults.
var DefaultConfig = Config{
	CESMaxCiliumendpointsPerCES: 100,
	CESSliceMode:                SliceModeIdentity,
	CESWriteQPSLimit:            10,
	CESWriteQPSBurst:            20,
}

// Flags registers the batcher's flags.
func (def Config) Flags(fs *pflag.FlagSet) {
	fs.Int(FlagMaxCEPsInCES, def.CESMaxCiliumendpointsPerCES, "Maximum number of CiliumEndpoints in one CiliumEndpointSlice")
	fs.String(FlagSliceMode, def.CESSliceMode, "How CiliumEndpoints are grouped into CiliumEndpointSlices: identity (by namespace and security identity; the only mode)")
	fs.Float64(FlagWriteQPS, def.CESWriteQPSLimit, fmt.Sprintf("CiliumEndpointSlice writes per second to the API server (at most %d)", MaxWriteQPS))
	fs.Int(FlagWriteBurst, def.CESWriteQPSBurst, fmt.Sprintf("Burst of CiliumEndpointSlice writes above --%s (at most %d)", FlagWriteQPS, MaxWriteBurst))
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
	if c.CESWriteQPSLimit <= 0 || c.CESWriteQPSLimit > MaxWriteQPS {
		return fmt.Errorf("invalid --%s=%v: must be greater than 0 and at most %d", FlagWriteQPS, c.CESWriteQPSLimit, MaxWriteQPS)
	}
	if c.CESWriteQPSBurst <= 0 || c.CESWriteQPSBurst > MaxWriteBurst {
		return fmt.Errorf("invalid --%s=%d: must be greater than 0 and at most %d", FlagWriteBurst, c.CESWriteQPSBurst, MaxWriteBurst)
	}
	return nil
}
