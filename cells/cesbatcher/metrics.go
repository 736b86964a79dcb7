package cesbatcher

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// registerRateMetrics registers cellium_ces_write_rate_limit and
// cellium_ces_write_burst_limit, the step of the write rate in force
// (Cilium has no such metric); without a registry it does nothing.
func registerRateMetrics(reg prometheus.Registerer, current func() RateLimit) error {
	if reg == nil {
		return nil
	}
	for _, g := range []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "cellium_ces_write_rate_limit",
			Help: "CiliumEndpointSlice writes a second the operator allows itself now (the --ces-rate-limits step for the number of CiliumNodes)"},
			func() float64 { return current().Limit }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "cellium_ces_write_burst_limit",
			Help: "CiliumEndpointSlice writes the operator allows itself in a burst now (the --ces-rate-limits step for the number of CiliumNodes)"},
			func() float64 { return float64(current().Burst) }),
	} {
		if err := reg.Register(g); err != nil {
			return fmt.Errorf("register CiliumEndpointSlice write rate metrics: %w", err)
		}
	}
	return nil
}
