package observer_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"strconv"
	"testing"
	"time"

	observerpb "github.com/cilium/cilium/api/v1/observer"
	peerpb "github.com/cilium/cilium/api/v1/peer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/cellium/cellium/test/harness"
)

// freePort returns a loopback TCP port nobody listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// The TCP listener serves Observer and Peer with mutual TLS: a client with
// a certificate of the client CA gets through, verifying the server as
// <node>.<cluster>.hubble-grpc.cilium.io; one without, or in plain text,
// does not. Peers are announced with that TLS server name.
func TestTCPListenerMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca := harness.NewTestCA(t, "hubble-ca")
	const serverName = "node-1.default.hubble-grpc.cilium.io"
	sc, sk := ca.Issue(t, serverName, x509.ExtKeyUsageServerAuth)
	cc, ck := ca.Issue(t, "hubble-relay", x509.ExtKeyUsageClientAuth)
	caFile := harness.WriteTestFile(t, dir, "ca.pem", ca.PEM)
	port := freePort(t)
	addr := "127.0.0.1:" + strconv.Itoa(port)
	a := startAgent(t, "--hubble-listen-address="+addr,
		"--hubble-tls-cert-file="+harness.WriteTestFile(t, dir, "server.pem", sc), "--hubble-tls-key-file="+harness.WriteTestFile(t, dir, "server-key.pem", sk),
		"--hubble-tls-client-ca-files="+caFile)
	a.addNode(t, "node-1", "10.0.0.1")

	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.PEM)
	clientCert, err := tls.X509KeyPair(cc, ck)
	if err != nil {
		t.Fatal(err)
	}
	dial := func(creds credentials.TransportCredentials) error {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
		if err != nil {
			return err
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err = observerpb.NewObserverClient(conn).ServerStatus(ctx, &observerpb.ServerStatusRequest{})
		return err
	}
	if err := dial(credentials.NewTLS(&tls.Config{RootCAs: roots, ServerName: serverName, Certificates: []tls.Certificate{clientCert}})); err != nil {
		t.Fatalf("mTLS client: %v", err)
	}
	if err := dial(credentials.NewTLS(&tls.Config{RootCAs: roots, ServerName: serverName})); err == nil {
		t.Fatal("a client without a certificate got through")
	}
	if err := dial(insecure.NewCredentials()); err == nil {
		t.Fatal("a plain-text client got through")
	}

	conn, err := grpc.NewClient("unix://"+a.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := peerpb.NewPeerClient(conn).Notify(ctx, &peerpb.NotifyRequest{})
	if err != nil {
		t.Fatal(err)
	}
	cn, err := stream.Recv()
	if err != nil || cn.GetAddress() != "10.0.0.1:"+strconv.Itoa(port) || cn.GetTls().GetServerName() != serverName {
		t.Fatalf("peer notification %v, %v: want address 10.0.0.1:%d and TLS server name %s", cn, err, port, serverName)
	}
}
