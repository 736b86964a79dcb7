package observer_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"

	"github.com/cellium/cellium/test/harness"
)

// The upstream hubble-relay finds the agent through its Peer service,
// dials its TCP listener with mutual TLS (verifying the server name the
// Peer service announced) and serves the cluster's flows and nodes:
// `hubble list nodes`, `hubble status` and `hubble observe` through it.
func TestHubbleRelay(t *testing.T) {
	bins := hubbleBinaries(t)
	dir := t.TempDir()
	ca := harness.NewTestCA(t, "hubble-ca")
	const serverName = "node-1.default.hubble-grpc.cilium.io"
	sc, sk := ca.Issue(t, serverName, x509.ExtKeyUsageServerAuth)
	cc, ck := ca.Issue(t, "hubble-relay", x509.ExtKeyUsageClientAuth)
	caFile := harness.WriteTestFile(t, dir, "ca.pem", ca.PEM)
	agentAddr := "127.0.0.1:" + strconv.Itoa(freePort(t))
	a := startAgent(t, "--hubble-listen-address="+agentAddr,
		"--hubble-tls-cert-file="+harness.WriteTestFile(t, dir, "server.pem", sc), "--hubble-tls-key-file="+harness.WriteTestFile(t, dir, "server-key.pem", sk),
		"--hubble-tls-client-ca-files="+caFile)
	a.addNode(t, "node-1", "127.0.0.1")
	feed(a, 0, 100, time.Now())

	relayAddr := "127.0.0.1:" + strconv.Itoa(freePort(t))
	ctx, cancel := context.WithCancel(context.Background())
	relay := exec.CommandContext(ctx, bins.Relay, "serve",
		"--peer-service", "unix://"+a.socket,
		"--listen-address", relayAddr,
		"--health-listen-address", "127.0.0.1:"+strconv.Itoa(freePort(t)),
		"--gops=false",
		"--disable-server-tls",
		"--tls-hubble-client-cert-file", harness.WriteTestFile(t, dir, "relay.pem", cc),
		"--tls-hubble-client-key-file", harness.WriteTestFile(t, dir, "relay-key.pem", ck),
		"--tls-hubble-server-ca-files", caFile,
		"--retry-timeout", "1s")
	var relayLog bytes.Buffer
	relay.Stdout, relay.Stderr = &relayLog, &relayLog
	if err := relay.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cancel()
		_ = relay.Wait()
		if t.Failed() {
			t.Logf("hubble-relay's log:\n%s", relayLog.String())
		}
	}()

	run := func(args ...string) (string, error) {
		cctx, ccancel := context.WithTimeout(ctx, 30*time.Second)
		defer ccancel()
		out, err := exec.CommandContext(cctx, bins.Hubble, append(args, "--server", relayAddr)...).CombinedOutput()
		return string(out), err
	}
	var out string
	var err error
	deadline := time.Now().Add(90 * time.Second)
	for {
		out, err = run("list", "nodes")
		if err == nil && strings.Contains(out, "node-1") && strings.Contains(out, "Connected") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("hubble list nodes through the relay never showed node-1 connected: %v\n%s", err, out)
		}
		time.Sleep(time.Second)
	}
	t.Logf("hubble list nodes:\n%s", out)

	// The relay reports itself healthy at its next probe of its peers.
	for {
		out, err = run("status")
		if err == nil && strings.Contains(out, "Connected Nodes: 1/1") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("hubble status through the relay: %v\n%s", err, out)
		}
		time.Sleep(time.Second)
	}
	t.Logf("hubble status:\n%s", out)
	out, err = run("observe", "--last", "10", "--verdict", "DROPPED", "-o", "json")
	if err != nil {
		t.Fatalf("hubble observe through the relay: %v\n%s", err, out)
	}
	flows := parseJSONFlows(t, out)
	if len(flows) != 10 {
		t.Fatalf("%d flows through the relay, want 10:\n%s", len(flows), out)
	}
	for _, f := range flows {
		if f.GetVerdict() != flowpb.Verdict_DROPPED || f.GetNodeName() != "node-1" {
			t.Fatalf("flow through the relay: %v", f)
		}
	}
}
