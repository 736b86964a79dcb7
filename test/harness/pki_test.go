package harness

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"path/filepath"
	"testing"
)

func TestPKI(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	p, err := newPKI(dir, net.ParseIP("10.96.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(p.caCert) {
		t.Fatal("CA certificate does not parse")
	}

	server, err := tls.LoadX509KeyPair(p.path(serverCertFile), p.path(serverKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(server.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"127.0.0.1", "localhost", "kubernetes.default.svc", "10.96.0.1"} {
		_, err := leaf.Verify(x509.VerifyOptions{DNSName: name, Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
		if err != nil {
			t.Errorf("serving certificate for %s: %v", name, err)
		}
	}

	admin, err := tls.LoadX509KeyPair(p.path(adminCertFile), p.path(adminKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	leaf, err = x509.ParseCertificate(admin.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("admin certificate: %v", err)
	}
	if len(leaf.Subject.Organization) != 1 || leaf.Subject.Organization[0] != "system:masters" {
		t.Errorf("admin certificate organisation = %v, want system:masters", leaf.Subject.Organization)
	}
}

// TestPKISignClient: a client certificate issued later (a node's, the
// scheduler's) verifies against the CA as a client certificate and names
// the user and groups.
func TestPKISignClient(t *testing.T) {
	p, err := newPKI(filepath.Join(t.TempDir(), "pki"), net.ParseIP("10.96.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := p.signClient("system:node:10.254.0.1", []string{"system:nodes"})
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(p.caCert)
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("node certificate: %v", err)
	}
	if leaf.Subject.CommonName != "system:node:10.254.0.1" || len(leaf.Subject.Organization) != 1 || leaf.Subject.Organization[0] != "system:nodes" {
		t.Errorf("subject %v", leaf.Subject)
	}
}
