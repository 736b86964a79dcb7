package hostlinks_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/cellium/cellium/daemon"
	"github.com/cellium/cellium/daemon/hostlinks"
)

// TestAgentGraphWithHostLinks builds the graph cellium-agent's main runs:
// the agent and this cell, with the doctor consuming the lister.
func TestAgentGraphWithHostLinks(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	var out bytes.Buffer
	cmd := daemon.NewCommand(daemon.Agent, hostlinks.Cell)
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs([]string{"hive"})
	if err := cmd.Execute(); err != nil {
		t.Fatalf("hive: %v\n%s", err, out.String())
	}
	for _, want := range []string{"host-links", "doctor", "doctor-settle-time"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("hive output lacks %q:\n%s", want, out.String())
		}
	}
}
