package observer_test

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"os/exec"
	"strings"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	observerpb "github.com/cilium/cilium/api/v1/observer"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/test/harness"
)

// hubbleBinaries returns the upstream hubble CLI and hubble-relay,
// building them into the cache the first time (make hubble-binaries does
// it ahead of make test).
func hubbleBinaries(t *testing.T) harness.HubbleBinaries {
	t.Helper()
	if bins, ok := harness.CachedHubble(); ok {
		return bins
	}
	if testing.Short() {
		t.Skip("the upstream hubble CLI is not built and -short skips the ~10 minute build: run make hubble-binaries")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	bins, err := harness.EnsureHubble(ctx, hivetest.Logger(t))
	if err != nil {
		t.Fatalf("build the hubble CLI: %v", err)
	}
	return bins
}

// hubble runs the hubble CLI against the agent's socket.
func (a *agent) hubble(t *testing.T, bin string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append(args, "--server", "unix://"+a.socket)...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	if err != nil {
		return out.String() + errOut.String(), err
	}
	return out.String(), nil
}

// parseJSONFlows parses `hubble observe -o json` output: one
// GetFlowsResponse a line.
func parseJSONFlows(t *testing.T, out string) []*flowpb.Flow {
	t.Helper()
	var flows []*flowpb.Flow
	for line := range strings.Lines(out) {
		if strings.TrimSpace(line) == "" {
			continue
		}
		var resp observerpb.GetFlowsResponse
		if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal([]byte(line), &resp); err != nil {
			t.Fatalf("hubble printed a line that is not a GetFlowsResponse: %v\n%s", err, line)
		}
		if f := resp.GetFlow(); f != nil {
			flows = append(flows, f)
		}
	}
	return flows
}

func TestHubbleCLI(t *testing.T) {
	bins := hubbleBinaries(t)
	a := startAgent(t)
	feed(a, 0, 1000, time.Now())

	t.Run("status", func(t *testing.T) {
		out, err := a.hubble(t, bins.Hubble, "status")
		if err != nil {
			t.Fatalf("hubble status: %v\n%s", err, out)
		}
		t.Logf("hubble status:\n%s", out)
		for _, want := range []string{"Healthcheck (via unix://" + a.socket + "): Ok", "Current/Max Flows: 1,000/4,095", "Flows/s:"} {
			if !strings.Contains(out, want) {
				t.Errorf("hubble status lacks %q", want)
			}
		}
	})

	t.Run("observe --last 100 -o json", func(t *testing.T) {
		out, err := a.hubble(t, bins.Hubble, "observe", "--last", "100", "-o", "json")
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		flows := parseJSONFlows(t, out)
		if len(flows) != 100 || flows[0].GetUuid() != "flow-900" || flows[99].GetUuid() != "flow-999" {
			t.Fatalf("got %d flows %v..., want flow-900..flow-999", len(flows), uuids(flows[:min(3, len(flows))]))
		}
		if f := flows[99]; f.GetSource().GetPodName() != "web-1" || f.GetVerdict() != flowpb.Verdict_DROPPED ||
			f.GetDropReasonDesc() != flowpb.DropReason_POLICY_DENIED || f.GetNodeName() != "node-1" {
			t.Fatalf("the last flow lost its fields on the way: %v", f)
		}
	})

	t.Run("observe compact", func(t *testing.T) {
		out, err := a.hubble(t, bins.Hubble, "observe", "--last", "4")
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		t.Logf("hubble observe --last 4:\n%s", out)
		for _, want := range []string{"demo/web-1", "demo/db-0:5432", "policy-verdict", "DROPPED", "Policy denied", "kube-system/coredns-7d9f:53"} {
			if !strings.Contains(out, want) {
				t.Errorf("compact output lacks %q", want)
			}
		}
	})

	// Each flag and what the demo mix gives for it: case i%4 of
	// demoFlow is 0 policy verdict web->db:5432, 1 trace web->db:5432,
	// 2 trace db->coredns udp 53, 3 drop web->db:6379.
	for _, tc := range []struct {
		flags []string
		want  int
		check func(*flowpb.Flow) bool
	}{
		{[]string{"--pod", "demo/web-1"}, 750, func(f *flowpb.Flow) bool {
			return f.GetSource().GetPodName() == "web-1" || f.GetDestination().GetPodName() == "web-1"
		}},
		{[]string{"--from-pod", "demo/db"}, 250, func(f *flowpb.Flow) bool { return f.GetSource().GetPodName() == "db-0" }},
		{[]string{"--namespace", "kube-system"}, 250, func(f *flowpb.Flow) bool { return f.GetDestination().GetNamespace() == "kube-system" }},
		{[]string{"--label", "app=coredns"}, 250, func(f *flowpb.Flow) bool { return f.GetDestination().GetPodName() == "coredns-7d9f" }},
		{[]string{"--from-label", "k8s:app=web"}, 750, func(f *flowpb.Flow) bool { return f.GetSource().GetPodName() == "web-1" }},
		{[]string{"--verdict", "DROPPED"}, 250, func(f *flowpb.Flow) bool { return f.GetVerdict() == flowpb.Verdict_DROPPED }},
		{[]string{"--protocol", "tcp"}, 750, func(f *flowpb.Flow) bool { return f.GetL4().GetTCP() != nil }},
		{[]string{"--protocol", "udp"}, 250, func(f *flowpb.Flow) bool { return f.GetL4().GetUDP() != nil }},
		{[]string{"--to-port", "5432"}, 500, func(f *flowpb.Flow) bool { return f.GetL4().GetTCP().GetDestinationPort() == 5432 }},
		{[]string{"--type", "drop"}, 250, func(f *flowpb.Flow) bool { return f.GetEventType().GetType() == 1 }},
		{[]string{"--type", "policy-verdict"}, 250, func(f *flowpb.Flow) bool { return f.GetEventType().GetType() == 5 }},
		{[]string{"--type", "trace"}, 500, func(f *flowpb.Flow) bool { return f.GetEventType().GetType() == 4 }},
		{[]string{"--tcp-flags", "SYN"}, 500, func(f *flowpb.Flow) bool { return f.GetL4().GetTCP().GetFlags().GetSYN() }},
		{[]string{"--node-name", "node-*"}, 1000, func(*flowpb.Flow) bool { return true }},
		{[]string{"--traffic-direction", "egress"}, 250, func(f *flowpb.Flow) bool { return f.GetTrafficDirection() == flowpb.TrafficDirection_EGRESS }},
		{[]string{"--drop-reason-desc", "POLICY_DENIED"}, 250, func(f *flowpb.Flow) bool { return f.GetDropReasonDesc() == flowpb.DropReason_POLICY_DENIED }},
		{[]string{"--to-service", "kube-system/kube-dns"}, 250, func(f *flowpb.Flow) bool { return f.GetDestinationService().GetName() == "kube-dns" }},
		{[]string{"--from-identity", "12002"}, 250, func(f *flowpb.Flow) bool { return f.GetSource().GetIdentity() == 12002 }},
		{[]string{"--to-workload", "db"}, 750, func(f *flowpb.Flow) bool { return f.GetDestination().GetPodName() == "db-0" }},
		{[]string{"--pod", "demo/web-1", "--verdict", "DROPPED"}, 250, func(f *flowpb.Flow) bool { return f.GetVerdict() == flowpb.Verdict_DROPPED }},
		{[]string{"--verdict", "FORWARDED", "--not", "--protocol", "udp"}, 500, func(f *flowpb.Flow) bool { return f.GetL4().GetTCP() != nil }},
		{[]string{"--ip-version", "v6"}, 0, nil},
	} {
		t.Run(strings.Join(tc.flags, " "), func(t *testing.T) {
			out, err := a.hubble(t, bins.Hubble, append([]string{"observe", "--last", "1000", "-o", "json"}, tc.flags...)...)
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			flows := parseJSONFlows(t, out)
			if len(flows) != tc.want {
				t.Errorf("%d flows, want %d", len(flows), tc.want)
			}
			for _, f := range flows {
				if !tc.check(f) {
					t.Fatalf("a flow that does not match: %v", f)
				}
			}
		})
	}

	// Filters the agent does not implement are refused by name, never
	// ignored; malformed ones get the server's reason.
	for _, tc := range []struct {
		flags []string
		want  string
	}{
		{[]string{"--fqdn", "www.cilium.io"}, "Unimplemented desc = the flow filter field source_fqdn is not implemented"},
		{[]string{"--http-status", "200"}, "http_status_code is not implemented"},
		{[]string{"--protocol", "quic"}, `unknown protocol "quic"`},
		{[]string{"--first", "10", "--follow"}, "cannot set both --first and --follow"},
	} {
		t.Run("refused "+strings.Join(tc.flags, " "), func(t *testing.T) {
			out, err := a.hubble(t, bins.Hubble, append([]string{"observe"}, tc.flags...)...)
			if err == nil || !strings.Contains(out, tc.want) {
				t.Fatalf("got %v:\n%s\nwant a failure saying %q", err, out, tc.want)
			}
		})
	}

	t.Run("observe --follow", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, bins.Hubble, "observe", "--follow", "-o", "json", "--server", "unix://"+a.socket)
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { cancel(); _ = cmd.Wait() }()
		lines := bufio.NewReader(stdout)
		// The CLI is connected once a flow written now reaches it.
		untilReceived(t, a, func() error { _, err := lines.ReadString('\n'); return err })
		f := demoFlow(3, time.Now())
		f.Uuid = "followed-drop"
		a.OnFlow(f)
		for {
			line, err := lines.ReadString('\n')
			if err == io.EOF || err != nil {
				t.Fatalf("hubble observe --follow ended before the flow arrived: %v", err)
			}
			if strings.Contains(line, `"followed-drop"`) {
				if fs := parseJSONFlows(t, line); len(fs) != 1 || fs[0].GetVerdict() != flowpb.Verdict_DROPPED {
					t.Fatalf("followed flow: %s", line)
				}
				return
			}
		}
	})

	t.Run("list nodes on an agent", func(t *testing.T) {
		out, err := a.hubble(t, bins.Hubble, "list", "nodes")
		if err == nil || !strings.Contains(out, "GetNodes is answered by hubble-relay") {
			t.Fatalf("hubble list nodes against an agent: %v\n%s", err, out)
		}
	})
}
