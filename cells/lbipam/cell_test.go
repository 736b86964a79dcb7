package lbipam_test

import (
	"strings"
	"testing"

	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/lbipam"
)

// TestCellDefaults checks Cilium's defaults: LB IPAM on, serving
// Services without a class.
func TestCellDefaults(t *testing.T) {
	var cfg lbipam.Config
	h := hivetest.New(t, nil, lbipam.Cell, hivetest.Capture(&cfg))
	if err := h.Populate(); err != nil {
		t.Fatal(err)
	}
	if !cfg.EnableLBIPAM || cfg.DefaultLBServiceIPAM != "lbipam" {
		t.Fatalf("defaults = %+v, want enabled, lbipam", cfg)
	}
}

// TestCellFlagValidated checks that a bad --default-lb-service-ipam stops
// start-up with an error naming the flag.
func TestCellFlagValidated(t *testing.T) {
	h := hivetest.New(t, []string{"--default-lb-service-ipam=metallb"}, lbipam.Cell)
	err := h.Populate()
	if err == nil || !strings.Contains(err.Error(), "--default-lb-service-ipam") {
		t.Fatalf("err = %v, want it to name --default-lb-service-ipam", err)
	}
}
