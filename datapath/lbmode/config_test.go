package lbmode_test

import (
	"strings"
	"testing"

	"github.com/cellium/cellium/datapath/bpf"
	"github.com/cellium/cellium/datapath/lbmode"
)

// The defaults are Cilium's; the modes map to NODEPORT_LB_MODE; values
// Cilium refuses, and the dispatch methods cellium lacks, are refused
// naming the flag.
func TestConfig(t *testing.T) {
	def := lbmode.DefaultConfig
	if def.Mode != "snat" || def.DSRDispatch != "opt" || def.Validate() != nil || def.UsesDSR() {
		t.Errorf("default %+v: want snat, opt, valid, no DSR", def)
	}
	for mode, want := range map[string]uint8{"snat": bpf.LBModeSNAT, "dsr": bpf.LBModeDSR, "hybrid": bpf.LBModeHybrid} {
		c := lbmode.Config{Mode: mode, DSRDispatch: "opt"}
		if err := c.Validate(); err != nil {
			t.Errorf("%s: %v", mode, err)
		}
		if got := c.Datapath(); got != want {
			t.Errorf("%s: datapath mode %d, want %d", mode, got, want)
		}
		if c.UsesDSR() != (mode != "snat") {
			t.Errorf("%s: UsesDSR %v", mode, c.UsesDSR())
		}
	}
	for _, tc := range []struct {
		c    lbmode.Config
		want []string
	}{
		{lbmode.Config{Mode: "dr", DSRDispatch: "opt"}, []string{"--bpf-lb-mode", "snat", "dsr", "hybrid"}},
		{lbmode.Config{Mode: "dsr", DSRDispatch: "geneve"}, []string{"--bpf-lb-dsr-dispatch=geneve", `"opt"`}},
		{lbmode.Config{Mode: "dsr", DSRDispatch: "ipip"}, []string{"--bpf-lb-dsr-dispatch=ipip", `"opt"`}},
		{lbmode.Config{Mode: "dsr", DSRDispatch: "x"}, []string{"--bpf-lb-dsr-dispatch"}},
	} {
		err := tc.c.Validate()
		if err == nil {
			t.Errorf("%+v: accepted", tc.c)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%+v: error %q lacks %q", tc.c, err, w)
			}
		}
	}
}

// DSR and hybrid are refused with tunnel routing, naming the
// alternatives; snat is fine with both routing modes, DSR with native.
func TestCheckRouting(t *testing.T) {
	for _, mode := range []string{"dsr", "hybrid"} {
		c := lbmode.Config{Mode: mode, DSRDispatch: "opt"}
		err := c.CheckRouting("tunnel")
		if err == nil {
			t.Errorf("%s with tunnel routing accepted", mode)
			continue
		}
		for _, w := range []string{"--bpf-lb-mode=" + mode, "--routing-mode=tunnel", "--routing-mode=native", "--bpf-lb-mode=snat", "geneve"} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q lacks %q", mode, err, w)
			}
		}
		if err := c.CheckRouting("native"); err != nil {
			t.Errorf("%s with native routing: %v", mode, err)
		}
	}
	for _, r := range []string{"tunnel", "native"} {
		if err := lbmode.DefaultConfig.CheckRouting(r); err != nil {
			t.Errorf("snat with %s routing: %v", r, err)
		}
	}
}
