package servicemap_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/servicemap"
	"github.com/cellium/cellium/test/harness"
)

// hubbleRelay returns the upstream hubble-relay binary that make
// hubble-binaries built, or skips (fails under CELLIUM_REQUIRE_PRIVILEGED=1
// unless -short): building it takes ~10 minutes and is the job of make
// test's prerequisite, not of this package's tests.
func hubbleRelay(t *testing.T) string {
	t.Helper()
	bins, ok := harness.CachedHubble()
	if !ok {
		msg := "the upstream hubble-relay is not built: run make hubble-binaries"
		if os.Getenv("CELLIUM_REQUIRE_PRIVILEGED") == "1" && !testing.Short() {
			t.Fatal(msg + "; CELLIUM_REQUIRE_PRIVILEGED=1 makes this a failure (make test-unit's -short does not)")
		}
		t.Skip(msg)
	}
	return bins.Relay
}

// The map reads the cluster's flows from the upstream hubble-relay over
// mutual TLS (--hubble-relay-tls-*), the relay reading the agent's TCP
// listener over mutual TLS, as the chart deploys them.
func TestServiceMapThroughHubbleRelay(t *testing.T) {
	relayBin := hubbleRelay(t)
	dir := t.TempDir()
	ca := harness.NewTestCA(t, "service-map-test-ca")
	caFile := harness.WriteTestFile(t, dir, "ca.pem", ca.PEM)
	agentCert, agentKey := ca.IssueFiles(t, dir, "node-1.default.hubble-grpc.cilium.io", x509.ExtKeyUsageServerAuth)
	relayClientCert, relayClientKey := ca.IssueFiles(t, dir, "hubble-relay-client", x509.ExtKeyUsageClientAuth)
	relayCert, relayKey := ca.IssueFiles(t, dir, "hubble-relay.kube-system.svc", x509.ExtKeyUsageServerAuth)
	mapCert, mapKey := ca.IssueFiles(t, dir, "cellium-operator", x509.ExtKeyUsageClientAuth)

	agentAddr := freeAddr(t)
	a := startAgent(t, socketPath(t), "--hubble-listen-address="+agentAddr,
		"--hubble-tls-cert-file="+agentCert, "--hubble-tls-key-file="+agentKey,
		"--hubble-tls-client-ca-files="+caFile)
	a.addNode(t, "node-1", "127.0.0.1")

	relayAddr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	relay := exec.CommandContext(ctx, relayBin, "serve",
		"--peer-service", "unix://"+a.socket,
		"--listen-address", relayAddr,
		"--health-listen-address", freeAddr(t),
		"--gops=false",
		"--tls-relay-server-cert-file", relayCert, "--tls-relay-server-key-file", relayKey,
		"--tls-relay-client-ca-files", caFile,
		"--tls-hubble-client-cert-file", relayClientCert, "--tls-hubble-client-key-file", relayClientKey,
		"--tls-hubble-server-ca-files", caFile,
		"--retry-timeout", "1s")
	var relayLog bytes.Buffer
	relay.Stdout, relay.Stderr = &relayLog, &relayLog
	if err := relay.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		_ = relay.Wait()
		if t.Failed() {
			t.Logf("hubble-relay's log:\n%s", relayLog.String())
		}
	})

	_, port, _ := strings.Cut(relayAddr, ":")
	base := startMap(t, "localhost:"+port,
		"--hubble-relay-tls-ca-files="+caFile,
		"--hubble-relay-tls-client-cert-file="+mapCert, "--hubble-relay-tls-client-key-file="+mapKey,
		"--hubble-relay-tls-server-name=hubble-relay.kube-system.svc")
	waitGraph(t, base, "connected to the relay", func(s servicemap.Snapshot) bool {
		return s.Upstream.State == servicemap.UpstreamConnected
	})
	// The relay reads the agent once it learnt it from the Peer service:
	// keep sending until a flow comes through.
	deadline := time.Now().Add(60 * time.Second)
	var s servicemap.Snapshot
	for {
		a.send(deniedFlow())
		s = getGraph(t, base)
		if e, ok := findEdge(s, deniedEdge); ok && e.State == servicemap.StateDropped {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no denied edge through the relay after 60 s: upstream %+v, stats %+v", s.Upstream, s.Stats)
		}
		time.Sleep(200 * time.Millisecond)
	}
	e, _ := findEdge(s, deniedEdge)
	if len(e.DeniedBy) != 1 || e.DeniedBy[0] != "CiliumNetworkPolicy demo/db-deny-redis" {
		t.Errorf("edge through the relay: %+v", e)
	}
	t.Logf("through hubble-relay: upstream %+v, edge %+v", s.Upstream, e)

	// Without a client certificate the relay refuses the map, and the page
	// says why.
	other := freeAddr(t)
	hivetest.Start(t, []string{
		"--hubble-service-map-listen-address=" + other,
		"--hubble-relay-address=localhost:" + port,
		"--hubble-relay-tls-ca-files=" + caFile,
		"--hubble-relay-tls-server-name=hubble-relay.kube-system.svc",
	}, servicemap.Cell)
	s = waitGraph(t, "http://"+other, "the refusal shown", func(s servicemap.Snapshot) bool {
		return s.Upstream.State == servicemap.UpstreamDisconnected
	})
	t.Logf("without a client certificate: %s", s.Upstream.Error)
}
