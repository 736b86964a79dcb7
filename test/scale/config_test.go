package scale

import (
	"strings"
	"testing"
)

// The setup line says at which write rate the operator batched the
// slices (the chart's step for the run's size, or the one given) and
// what kvstore mode writes.
func TestSetupLine(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{CIConfig(ModeCES), "rateLimits (10 slice writes/s and bursts of 20 below 100 CiliumNodes, 50/s and 100 from 100 on): 50/s and 100 here"},
		{Config{Mode: ModeCES, Nodes: 5}, "): 10/s and 20 here"},
		{Config{Mode: ModeCES, Nodes: 5, OperatorArgs: []string{`--ces-rate-limits=[{"nodes":0,"limit":5,"burst":5}]`}}, "CES write rate as given (-operator-arg)"},
		{Config{Mode: ModeCES, Nodes: 5, OperatorArgs: []string{"--ces-write-qps-limit=5"}}, "CES write rate as given (-operator-arg)"},
		{Config{Mode: ModeCES, Nodes: 5, OperatorArgs: []string{"--ces-max-ciliumendpoints-per-ces=50"}}, "): 10/s and 20 here"},
		{CIConfig(ModeKVStore), "node keys and ipcache keys in etcd (leased), CiliumNodes and CiliumEndpoints written too"},
	} {
		if got := tc.cfg.Setup(); !strings.Contains(got, tc.want) {
			t.Errorf("%s mode: setup %q lacks %q", tc.cfg.Mode, got, tc.want)
		}
	}
	if got := CIConfig(ModeCEP).Setup(); strings.Contains(got, ";") {
		t.Errorf("CEP mode's setup line changed: %q", got)
	}
}
