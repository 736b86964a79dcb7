package bpf_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// A client process of TestPrivilegedProgramClusterIPSocketLB, started
	// in a cgroup of the test's own (clusterip_privileged_test.go).
	if args := os.Getenv(childEnv); args != "" {
		os.Exit(runChild(args))
	}
	// The stand-in agent of TestPrivilegedNodePortAgentGone.
	if args := os.Getenv(agentEnv); args != "" {
		os.Exit(runAgent(args))
	}
	goleak.VerifyTestMain(m)
}
