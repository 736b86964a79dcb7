package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/cellium/cellium/daemon"
)

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	t.Setenv("KUBERNETES_SERVICE_HOST", "") // never in-cluster here
	var out bytes.Buffer
	cmd := daemon.NewCommand(agentCells()...)
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

// The agent has Cilium's backend selection flags and refuses values
// Cilium refuses, naming the flag (and for the table size, the sizes it
// takes).
func TestMaglevFlags(t *testing.T) {
	out, err := run(t, "hive", "--bpf-lb-algorithm=maglev", "--bpf-lb-maglev-table-size=65521")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"--bpf-lb-algorithm=maglev (default random)", "--bpf-lb-maglev-table-size=65521 (default 16381)",
		"--bpf-lb-maglev-hash-seed=JLfvgnHc2kaSUFaI (default JLfvgnHc2kaSUFaI)"} {
		if !strings.Contains(out, want) {
			t.Errorf("agent hive output lacks %s", want)
		}
	}
	for _, tc := range []struct {
		arg  string
		want []string
	}{
		{"--bpf-lb-algorithm=roundrobin", []string{"--bpf-lb-algorithm", "random", "maglev"}},
		{"--bpf-lb-maglev-table-size=1000", []string{"--bpf-lb-maglev-table-size=1000", "16381", "131071"}},
		{"--bpf-lb-maglev-hash-seed=abc", []string{"--bpf-lb-maglev-hash-seed"}},
	} {
		_, err := run(t, "hive", tc.arg)
		if err == nil {
			t.Errorf("%s: accepted", tc.arg)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q lacks %q", tc.arg, err, w)
			}
		}
	}
}
