package metrics

import (
	"fmt"
	"net"

	"github.com/spf13/pflag"
)

// Config is the Hubble metrics cell's configuration, with Cilium's flag
// names.
type Config struct {
	// HubbleMetricsServer is the address /metrics is served on; empty (the
	// default) serves nothing and counts nothing.
	HubbleMetricsServer string
	// HubbleMetrics is the list of metrics to count, separated by spaces
	// (Cilium's form) or commas, each "name[:option=value;...]".
	HubbleMetrics string
	// EnableHubbleOpenMetrics serves the OpenMetrics format to scrapers that
	// ask for it.
	EnableHubbleOpenMetrics bool
}

// DefaultConfig serves no metrics, as Cilium's default.
var DefaultConfig = Config{}

// Flags registers --hubble-metrics-server, --hubble-metrics and
// --enable-hubble-open-metrics.
func (def Config) Flags(fs *pflag.FlagSet) {
	fs.String("hubble-metrics-server", def.HubbleMetricsServer,
		`Address to serve Hubble's flow metrics on (":9965" for every address of the node); "" serves none`)
	fs.String("hubble-metrics", def.HubbleMetrics,
		`Hubble metrics to enable, separated by spaces or commas, each name[:option=value;...] (names: `+knownNamesList()+
			`; options: sourceContext, destinationContext, their Egress/Ingress forms and labelsContext), e.g. "drop tcp flow:sourceContext=pod;destinationContext=pod"`)
	fs.Bool("enable-hubble-open-metrics", def.EnableHubbleOpenMetrics,
		"Serve Hubble's metrics in the OpenMetrics format to scrapers that ask for it")
}

// Validate implements hive.Validator: the list parses and the address is
// host:port.
func (c Config) Validate() error {
	if _, err := ParseSpecs(c.HubbleMetrics); err != nil {
		return fmt.Errorf("--hubble-metrics: %w", err)
	}
	if c.HubbleMetricsServer != "" {
		if _, _, err := net.SplitHostPort(c.HubbleMetricsServer); err != nil {
			return fmt.Errorf("--hubble-metrics-server=%q: give host:port (\":9965\" for every address, \"127.0.0.1:9965\" for loopback), or \"\" to serve no metrics: %w",
				c.HubbleMetricsServer, err)
		}
	}
	return nil
}
