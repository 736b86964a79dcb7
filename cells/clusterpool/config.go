package clusterpool

import (
	"github.com/spf13/pflag"

	"github.com/cellium/cellium/cells/clusterpool/cidralloc"
)

// Config is the cluster pool's configuration; the flag names are Cilium's.
type Config struct {
	// ClusterPoolIPv4CIDR are the cluster CIDRs node CIDRs are carved from.
	ClusterPoolIPv4CIDR []string
	// ClusterPoolIPv4MaskSize is the prefix length of each node's CIDR.
	ClusterPoolIPv4MaskSize int
}

// DefaultConfig splits 10.0.0.0/8 into /24 node CIDRs, as Cilium does.
var DefaultConfig = Config{
	ClusterPoolIPv4CIDR:     []string{cidralloc.DefaultIPv4CIDR},
	ClusterPoolIPv4MaskSize: cidralloc.DefaultIPv4MaskSize,
}

// Flags registers --cluster-pool-ipv4-cidr and --cluster-pool-ipv4-mask-size.
func (def Config) Flags(fs *pflag.FlagSet) {
	fs.StringSlice(cidralloc.FlagIPv4CIDR, def.ClusterPoolIPv4CIDR,
		"IPv4 CIDRs the operator carves per-node pod CIDRs out of (cluster-pool IPAM)")
	fs.Int(cidralloc.FlagIPv4MaskSize, def.ClusterPoolIPv4MaskSize,
		"Prefix length of the pod CIDR each node gets from --cluster-pool-ipv4-cidr")
}

// Validate checks the CIDRs and the mask size; the error names the flag to
// fix.
func (c Config) Validate() error {
	_, err := c.allocConfig().Validate()
	return err
}

func (c Config) allocConfig() cidralloc.Config {
	return cidralloc.Config{IPv4CIDRs: c.ClusterPoolIPv4CIDR, IPv4MaskSize: c.ClusterPoolIPv4MaskSize}
}
