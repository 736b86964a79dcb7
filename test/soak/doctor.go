package soak

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"
)

// doctorTimeout bounds one `cellium doctor` run.
const doctorTimeout = time.Minute

// Finding is one disagreement `cellium doctor -o json` reports.
type Finding struct {
	Kind    string `json:"kind"`
	Object  string `json:"object"`
	Message string `json:"message"`
	Hint    string `json:"hint"`
}

// errNoDoctor means the CLI has no doctor command (yet).
var errNoDoctor = errors.New("the cellium CLI has no doctor command")

// runDoctor runs `cellium doctor -o json` against the agent's socket. It
// returns the findings (none on a clean node, exit code 0), errNoDoctor
// when the CLI does not know the command, or another error when the
// command failed without findings.
func runDoctor(ctx context.Context, cli, socket string) ([]Finding, error) {
	ctx, cancel := context.WithTimeout(ctx, doctorTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, cli, "-H", "unix://"+socket, "doctor", "-o", "json")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	if runErr != nil && strings.Contains(stderr.String()+stdout.String(), `unknown command "doctor"`) {
		return nil, errNoDoctor
	}
	var out struct {
		Findings []Finding `json:"findings"`
	}
	parseErr := json.Unmarshal(stdout.Bytes(), &out)
	switch {
	case runErr == nil && (parseErr == nil || strings.TrimSpace(stdout.String()) == ""):
		return out.Findings, nil
	case runErr == nil:
		return nil, fmt.Errorf("cellium doctor -o json: output does not parse: %w: %q", parseErr, lastBytes(stdout.String(), 2000))
	case parseErr == nil && len(out.Findings) > 0:
		return out.Findings, nil
	default:
		return nil, fmt.Errorf("cellium doctor -o json: %v without findings: stdout %q, stderr %q",
			runErr, lastBytes(stdout.String(), 2000), lastBytes(stderr.String(), 2000))
	}
}
