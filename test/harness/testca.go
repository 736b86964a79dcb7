package harness

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestCA is a certificate authority for a test's mutual TLS (Hubble's
// listener, relay, the service map): ECDSA P-256, valid for an hour
// either side of now.
type TestCA struct {
	// PEM is the CA's certificate.
	PEM  []byte
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// NewTestCA makes a CA named name; it fails the test on error.
func NewTestCA(t testing.TB, name string) *TestCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: serial(), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &TestCA{PEM: pemBlock("CERTIFICATE", der), cert: cert, key: key}
}

// Issue returns a certificate for name (its common name and DNS name, or
// its IP address when name is one) with the extended usage, and its key,
// as PEM.
func (ca *TestCA) Issue(t testing.TB, name string, usage x509.ExtKeyUsage) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: serial(), Subject: pkix.Name{CommonName: name},
		DNSNames: []string{name}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}}
	if ip := net.ParseIP(name); ip != nil {
		tmpl.DNSNames, tmpl.IPAddresses = nil, []net.IP{ip}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err = ecKeyPEM(key)
	if err != nil {
		t.Fatal(err)
	}
	return pemBlock("CERTIFICATE", der), keyPEM
}

// IssueFiles is [TestCA.Issue] written to dir as name.pem and
// name-key.pem; it returns their paths.
func (ca *TestCA) IssueFiles(t testing.TB, dir, name string, usage x509.ExtKeyUsage) (certFile, keyFile string) {
	t.Helper()
	c, k := ca.Issue(t, name, usage)
	return WriteTestFile(t, dir, name+".pem", c), WriteTestFile(t, dir, name+"-key.pem", k)
}

// WriteTestFile writes data to dir/name (mode 0600) and returns its path;
// it fails the test on error.
func WriteTestFile(t testing.TB, dir, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
