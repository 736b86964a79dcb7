package harness

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki is the key material of one cluster, as PEM, plus where it is on disk.
type pki struct {
	caCert, caKey         []byte
	serverCert, serverKey []byte
	adminCert, adminKey   []byte
	saKey, saPub          []byte

	dir string
}

func (p *pki) path(name string) string { return filepath.Join(p.dir, name) }

// Files the PKI is written to, in pki.dir.
const (
	caCertFile     = "ca.crt"
	caKeyFile      = "ca.key"
	serverCertFile = "apiserver.crt"
	serverKeyFile  = "apiserver.key"
	adminCertFile  = "admin.crt"
	adminKeyFile   = "admin.key"
	saKeyFile      = "sa.key"
	saPubFile      = "sa.pub"
)

// adminUser is the common name of the admin client certificate; its
// organisation system:masters makes it cluster-admin under RBAC.
const adminUser = "cellium-admin"

// newPKI generates a CA, the API server's serving certificate (for loopback,
// localhost and the in-cluster names of the kubernetes Service at
// serviceIP, and the extra addresses the API server listens on), an admin
// client certificate and a service-account signing key, and writes them to
// dir. ECDSA P-256 keys keep generation in the milliseconds.
func newPKI(dir string, serviceIP net.IP, extraIPs ...net.IP) (*pki, error) {
	now := time.Now()
	notBefore, notAfter := now.Add(-time.Hour), now.Add(10*365*24*time.Hour)

	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate CA key: %w", err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "cellium-harness-ca"},
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, caKey.Public(), caKey)
	if err != nil {
		return nil, fmt.Errorf("create CA certificate: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, fmt.Errorf("parse CA certificate: %w", err)
	}

	leaf := func(tmpl *x509.Certificate) (certPEM, keyPEM []byte, err error) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, nil, err
		}
		tmpl.SerialNumber = serial()
		tmpl.NotBefore, tmpl.NotAfter = notBefore, notAfter
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		tmpl.BasicConstraintsValid = true
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
		if err != nil {
			return nil, nil, err
		}
		keyPEM, err = ecKeyPEM(key)
		return pemBlock("CERTIFICATE", der), keyPEM, err
	}

	p := &pki{dir: dir, caCert: pemBlock("CERTIFICATE", caDER)}
	if p.caKey, err = ecKeyPEM(caKey); err != nil {
		return nil, fmt.Errorf("encode CA key: %w", err)
	}
	p.serverCert, p.serverKey, err = leaf(&x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames: []string{
			"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
			"kubernetes.default.svc.cluster.local",
		},
		IPAddresses: append([]net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback, serviceIP}, extraIPs...),
	})
	if err != nil {
		return nil, fmt.Errorf("create API server certificate: %w", err)
	}
	p.adminCert, p.adminKey, err = leaf(&x509.Certificate{
		Subject:     pkix.Name{CommonName: adminUser, Organization: []string{"system:masters"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	if err != nil {
		return nil, fmt.Errorf("create admin certificate: %w", err)
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate service account key: %w", err)
	}
	if p.saKey, err = ecKeyPEM(saKey); err != nil {
		return nil, fmt.Errorf("encode service account key: %w", err)
	}
	if p.saPub, err = publicKeyPEM(saKey.Public()); err != nil {
		return nil, fmt.Errorf("encode service account key: %w", err)
	}

	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("write PKI: %w", err)
	}
	for name, data := range map[string][]byte{
		caCertFile: p.caCert, caKeyFile: p.caKey,
		serverCertFile: p.serverCert, serverKeyFile: p.serverKey,
		adminCertFile: p.adminCert, adminKeyFile: p.adminKey,
		saKeyFile: p.saKey, saPubFile: p.saPub,
	} {
		if err := os.WriteFile(p.path(name), data, 0o600); err != nil {
			return nil, fmt.Errorf("write PKI: %w", err)
		}
	}
	return p, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return n.Add(n, big.NewInt(1))
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

func ecKeyPEM(k *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return nil, err
	}
	return pemBlock("EC PRIVATE KEY", der), nil
}

func publicKeyPEM(k crypto.PublicKey) ([]byte, error) {
	der, err := x509.MarshalPKIXPublicKey(k)
	if err != nil {
		return nil, err
	}
	return pemBlock("PUBLIC KEY", der), nil
}

// signClient returns a client certificate and key for user cn in groups
// orgs, signed by the cluster's CA.
func (p *pki) signClient(cn string, orgs []string) (certPEM, keyPEM []byte, err error) {
	caBlock, _ := pem.Decode(p.caCert)
	keyBlock, _ := pem.Decode(p.caKey)
	if caBlock == nil || keyBlock == nil {
		return nil, nil, fmt.Errorf("sign client certificate: the CA is not PEM")
	}
	ca, err := x509.ParseCertificate(caBlock.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("sign client certificate: %w", err)
	}
	caKey, err := x509.ParseECPrivateKey(keyBlock.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("sign client certificate: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("sign client certificate: %w", err)
	}
	now := time.Now()
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
	}, ca, key.Public(), caKey)
	if err != nil {
		return nil, nil, fmt.Errorf("sign client certificate: %w", err)
	}
	if keyPEM, err = ecKeyPEM(key); err != nil {
		return nil, nil, fmt.Errorf("sign client certificate: %w", err)
	}
	return pemBlock("CERTIFICATE", der), keyPEM, nil
}
