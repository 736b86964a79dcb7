package metrics

import "github.com/spf13/pflag"

// Config is the metrics cell's configuration.
type Config struct {
	// PrometheusServeAddr is where /metrics is served; empty disables it.
	PrometheusServeAddr string
}

// DefaultConfig serves nothing, as Cilium's default.
var DefaultConfig = Config{PrometheusServeAddr: ""}

// Flags registers --prometheus-serve-addr.
func (def Config) Flags(fs *pflag.FlagSet) {
	fs.String("prometheus-serve-addr", def.PrometheusServeAddr, `IP:Port on which to serve Prometheus metrics (pass ":9962" for all interfaces, "" to disable)`)
}
