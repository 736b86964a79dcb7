package bpfconfig_test

import (
	"testing"

	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/datapath/bpfconfig"
)

func TestFlags(t *testing.T) {
	var c bpfconfig.Config
	hivetest.Start(t, []string{"--enable-bpf-datapath", "--bpf-root=/tmp/x"}, bpfconfig.Cell, hivetest.Capture(&c))
	if !c.EnableBPFDatapath || c.BPFRoot != "/tmp/x" || c.PinDir() != "/tmp/x/cellium" {
		t.Errorf("config %+v, pin dir %s", c, c.PinDir())
	}
	if err := (bpfconfig.Config{EnableBPFDatapath: true, BPFRoot: "relative"}).Validate(); err == nil {
		t.Error("a relative --bpf-root passed validation")
	}
}
