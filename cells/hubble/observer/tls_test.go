package observer_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	observerpb "github.com/cilium/cilium/api/v1/observer"
	peerpb "github.com/cilium/cilium/api/v1/peer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
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

type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newCA(t *testing.T) *testCA {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "hubble-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns a certificate and key (PEM) for name.
func (ca *testCA) issue(t *testing.T, name string, usage x509.ExtKeyUsage) (certPEM, keyPEM []byte) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		DNSNames: []string{name}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalECPrivateKey(key)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

func writeFile(t *testing.T, dir, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// The TCP listener serves Observer and Peer with mutual TLS: a client with
// a certificate of the client CA gets through, verifying the server as
// <node>.<cluster>.hubble-grpc.cilium.io; one without, or in plain text,
// does not. Peers are announced with that TLS server name.
func TestTCPListenerMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca := newCA(t)
	const serverName = "node-1.default.hubble-grpc.cilium.io"
	sc, sk := ca.issue(t, serverName, x509.ExtKeyUsageServerAuth)
	cc, ck := ca.issue(t, "hubble-relay", x509.ExtKeyUsageClientAuth)
	caFile := writeFile(t, dir, "ca.pem", ca.pem)
	port := freePort(t)
	addr := "127.0.0.1:" + strconv.Itoa(port)
	a := startAgent(t, "--hubble-listen-address="+addr,
		"--hubble-tls-cert-file="+writeFile(t, dir, "server.pem", sc), "--hubble-tls-key-file="+writeFile(t, dir, "server-key.pem", sk),
		"--hubble-tls-client-ca-files="+caFile)
	a.addNode(t, "node-1", "10.0.0.1")

	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.pem)
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
