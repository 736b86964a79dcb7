package bpfconfig_test

import (
	"testing"

	"github.com/spf13/pflag"

	"github.com/cellium/cellium/datapath/bpfconfig"
)

func TestFlags(t *testing.T) {
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	bpfconfig.DefaultConfig.Flags(fs)
	if err := fs.Parse([]string{"--bpf-root=/tmp/x"}); err != nil {
		t.Fatal(err)
	}
	if v, _ := fs.GetString("bpf-root"); v != "/tmp/x" {
		t.Errorf("--bpf-root = %q", v)
	}
	if d := (bpfconfig.Config{BPFRoot: "/tmp/x"}).PinDir(); d != "/tmp/x/cellium" {
		t.Errorf("pin dir %s", d)
	}
	if err := (bpfconfig.Config{BPFRoot: "relative"}).Validate(); err == nil {
		t.Error("a relative --bpf-root passed validation")
	}
	if err := bpfconfig.DefaultConfig.Validate(); err != nil {
		t.Error(err)
	}
}
