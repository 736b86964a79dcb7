package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
)

func run(args ...string) error {
	cmd := newRootCmd()
	cmd.SetArgs(args)
	cmd.SetOut(&bytes.Buffer{})
	cmd.SetErr(&bytes.Buffer{})
	return cmd.ExecuteContext(context.Background())
}

func TestFlagErrors(t *testing.T) {
	root := os.Geteuid() == 0
	tests := []struct {
		args []string
		want string // as root; without root every command asks for it
	}{
		{[]string{"run", "--kubeconfig", "/nonexistent"}, "--node-name is required"},
		{[]string{"run", "--node-name", "n", "--kubeconfig", ""}, "no --kubeconfig"},
		{[]string{"run", "--node-name", "n", "--kubeconfig", "k", "--node-ip", "nope"}, `--node-ip "nope"`},
		{[]string{"bench", "-n", "0"}, "-n must be at least 1"},
	}
	for _, tt := range tests {
		err := run(tt.args...)
		want := tt.want
		if !root {
			want = "needs root"
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("devkubelet %v: %v, want an error containing %q", tt.args, err, want)
		}
	}
}

func TestNeedRoot(t *testing.T) {
	err := needRoot("devkubelet run")
	if os.Geteuid() == 0 {
		if err != nil {
			t.Errorf("as root: %v", err)
		}
		return
	}
	if err == nil || !strings.Contains(err.Error(), "run it as root") {
		t.Errorf("not root: %v", err)
	}
}
