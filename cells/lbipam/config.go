package lbipam

import (
	"fmt"

	"github.com/spf13/pflag"
)

// Flag names (Cilium's; Helm values enableLBIPAM and defaultLBServiceIPAM).
const (
	FlagEnableLBIPAM         = "enable-lb-ipam"
	FlagDefaultLBServiceIPAM = "default-lb-service-ipam"
)

// Values of --default-lb-service-ipam.
const (
	DefaultLBClassLBIPAM   = "lbipam"
	DefaultLBClassNodeIPAM = "nodeipam"
	DefaultLBClassNone     = "none"
)

// Config is LB IPAM's configuration.
type Config struct {
	// EnableLBIPAM runs LB IPAM on the leading operator.
	EnableLBIPAM bool
	// DefaultLBServiceIPAM says who serves LoadBalancer Services without
	// spec.loadBalancerClass: "lbipam" (LB IPAM), "nodeipam" or "none"
	// (nobody in cellium: it has no node IPAM).
	DefaultLBServiceIPAM string
}

// DefaultConfig is Cilium's: on, and serving Services without a class.
var DefaultConfig = Config{
	EnableLBIPAM:         true,
	DefaultLBServiceIPAM: DefaultLBClassLBIPAM,
}

// Flags registers --enable-lb-ipam and --default-lb-service-ipam.
func (def Config) Flags(fs *pflag.FlagSet) {
	fs.Bool(FlagEnableLBIPAM, def.EnableLBIPAM, "Enable LB IPAM: addresses of LoadBalancer Services from CiliumLoadBalancerIPPools")
	fs.String(FlagDefaultLBServiceIPAM, def.DefaultLBServiceIPAM,
		"Indicates the default LoadBalancer Service IPAM when no LoadBalancer class is set. Applicable values: lbipam, nodeipam, none")
}

// Validate checks --default-lb-service-ipam.
func (c Config) Validate() error {
	switch c.DefaultLBServiceIPAM {
	case DefaultLBClassLBIPAM, DefaultLBClassNodeIPAM, DefaultLBClassNone:
		return nil
	}
	return fmt.Errorf("invalid --%s=%q: want lbipam, nodeipam or none", FlagDefaultLBServiceIPAM, c.DefaultLBServiceIPAM)
}
