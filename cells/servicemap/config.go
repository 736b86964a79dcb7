package servicemap

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"google.golang.org/grpc/credentials"
)

// Config is the service map's configuration.
type Config struct {
	// HubbleServiceMapListenAddress is the HTTP address of the map; empty
	// (the default) turns it off.
	HubbleServiceMapListenAddress string
	// HubbleRelayAddress is where the flows come from: hubble-relay's
	// host:port or an agent's Hubble socket (unix:///path).
	HubbleRelayAddress string
	// HubbleRelayTLSCAFiles, when set, make the connection to the relay
	// TLS, verified against these CA certificates (PEM).
	HubbleRelayTLSCAFiles []string
	// HubbleRelayTLSClientCertFile and HubbleRelayTLSClientKeyFile are the
	// client certificate presented to a relay that requires mutual TLS.
	HubbleRelayTLSClientCertFile string
	HubbleRelayTLSClientKeyFile  string
	// HubbleRelayTLSServerName is the name the relay's certificate must
	// carry; empty: the host of HubbleRelayAddress.
	HubbleRelayTLSServerName string
	// HubbleServiceMapSince is how far back the map starts: the flows of
	// this last stretch of time are read at start.
	HubbleServiceMapSince time.Duration
	// HubbleServiceMapMaxEdges bounds the edges kept; the least recently
	// seen goes first.
	HubbleServiceMapMaxEdges int
	// HubbleServiceMapIdleTimeout is how long an edge without flows stays
	// on the map.
	HubbleServiceMapIdleTimeout time.Duration
}

// DefaultConfig: off; when on, 5 minutes of history, at most 2000 edges,
// an edge forgotten after 15 idle minutes.
var DefaultConfig = Config{
	HubbleServiceMapSince:       5 * time.Minute,
	HubbleServiceMapMaxEdges:    2000,
	HubbleServiceMapIdleTimeout: 15 * time.Minute,
}

// Flags registers the --hubble-service-map-* and --hubble-relay-* flags.
func (def Config) Flags(fs *pflag.FlagSet) {
	fs.String("hubble-service-map-listen-address", def.HubbleServiceMapListenAddress,
		`HTTP address of the read-only service map page and its JSON API, e.g. "localhost:12000"; empty: no service map`)
	fs.String("hubble-relay-address", def.HubbleRelayAddress,
		"Where the service map reads flows: hubble-relay's host:port (e.g. hubble-relay.kube-system.svc:80) or one agent's Hubble socket (unix:///var/run/cellium/hubble.sock)")
	fs.StringSlice("hubble-relay-tls-ca-files", def.HubbleRelayTLSCAFiles,
		"PEM CA certificates that verify hubble-relay's TLS certificate; set means TLS to the relay (plain text otherwise)")
	fs.String("hubble-relay-tls-client-cert-file", def.HubbleRelayTLSClientCertFile,
		"PEM client certificate for a relay that requires mutual TLS (with --hubble-relay-tls-client-key-file)")
	fs.String("hubble-relay-tls-client-key-file", def.HubbleRelayTLSClientKeyFile,
		"PEM private key of --hubble-relay-tls-client-cert-file")
	fs.String("hubble-relay-tls-server-name", def.HubbleRelayTLSServerName,
		"Name hubble-relay's certificate must carry; empty: the host of --hubble-relay-address")
	fs.Duration("hubble-service-map-since", def.HubbleServiceMapSince,
		"How far back the service map starts: it reads the flows of this last stretch of time when it connects")
	fs.Int("hubble-service-map-max-edges", def.HubbleServiceMapMaxEdges,
		"Most edges the service map keeps; beyond it the least recently seen edge is dropped")
	fs.Duration("hubble-service-map-idle-timeout", def.HubbleServiceMapIdleTimeout,
		"How long an edge without flows stays on the service map")
}

// Enabled reports whether the service map is on.
func (c Config) Enabled() bool { return c.HubbleServiceMapListenAddress != "" }

// Validate implements hive.Validator.
func (c Config) Validate() error {
	if !c.Enabled() {
		return nil
	}
	if _, _, err := net.SplitHostPort(c.HubbleServiceMapListenAddress); err != nil {
		return fmt.Errorf("invalid --hubble-service-map-listen-address=%q: give host:port, e.g. \"localhost:12000\": %w", c.HubbleServiceMapListenAddress, err)
	}
	if c.HubbleRelayAddress == "" {
		return fmt.Errorf("--hubble-service-map-listen-address=%s needs flows: give --hubble-relay-address (hubble-relay's host:port, or unix:///var/run/cellium/hubble.sock for one node)", c.HubbleServiceMapListenAddress)
	}
	if path, ok := strings.CutPrefix(c.HubbleRelayAddress, "unix://"); ok {
		if path == "" {
			return fmt.Errorf("invalid --hubble-relay-address=%q: give the socket's path, e.g. unix:///var/run/cellium/hubble.sock", c.HubbleRelayAddress)
		}
		if c.tls() {
			return fmt.Errorf("--hubble-relay-address=%s is a unix socket: the --hubble-relay-tls-* flags do not apply to it, drop them", c.HubbleRelayAddress)
		}
	} else if _, _, err := net.SplitHostPort(strings.TrimPrefix(c.HubbleRelayAddress, "dns:///")); err != nil {
		return fmt.Errorf("invalid --hubble-relay-address=%q: give host:port (e.g. hubble-relay.kube-system.svc:80) or unix:///path: %w", c.HubbleRelayAddress, err)
	}
	if (c.HubbleRelayTLSClientCertFile == "") != (c.HubbleRelayTLSClientKeyFile == "") {
		return fmt.Errorf("--hubble-relay-tls-client-cert-file and --hubble-relay-tls-client-key-file go together: give both or neither")
	}
	if c.HubbleRelayTLSClientCertFile != "" && len(c.HubbleRelayTLSCAFiles) == 0 {
		return fmt.Errorf("--hubble-relay-tls-client-cert-file is for TLS to the relay: give --hubble-relay-tls-ca-files too (the CA that signed the relay's certificate)")
	}
	if c.HubbleRelayTLSServerName != "" && len(c.HubbleRelayTLSCAFiles) == 0 {
		return fmt.Errorf("--hubble-relay-tls-server-name is for TLS to the relay: give --hubble-relay-tls-ca-files too")
	}
	if c.HubbleServiceMapSince < 0 {
		return fmt.Errorf("invalid --hubble-service-map-since=%s: give a duration of zero or more", c.HubbleServiceMapSince)
	}
	if c.HubbleServiceMapMaxEdges < 1 {
		return fmt.Errorf("invalid --hubble-service-map-max-edges=%d: give at least 1", c.HubbleServiceMapMaxEdges)
	}
	if c.HubbleServiceMapIdleTimeout <= 0 {
		return fmt.Errorf("invalid --hubble-service-map-idle-timeout=%s: give a positive duration, e.g. 15m", c.HubbleServiceMapIdleTimeout)
	}
	return nil
}

func (c Config) tls() bool {
	return len(c.HubbleRelayTLSCAFiles) > 0 || c.HubbleRelayTLSClientCertFile != "" || c.HubbleRelayTLSServerName != ""
}

// transportCredentials returns the relay connection's TLS credentials, nil
// for plain text.
func (c Config) transportCredentials() (credentials.TransportCredentials, error) {
	if len(c.HubbleRelayTLSCAFiles) == 0 {
		return nil, nil
	}
	pool := x509.NewCertPool()
	for _, f := range c.HubbleRelayTLSCAFiles {
		pem, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("read --hubble-relay-tls-ca-files %s: %w", f, err)
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--hubble-relay-tls-ca-files %s holds no PEM certificate: give the CA certificate that signed the relay's", f)
		}
	}
	cfg := &tls.Config{RootCAs: pool, ServerName: c.HubbleRelayTLSServerName, MinVersion: tls.VersionTLS13}
	if c.HubbleRelayTLSClientCertFile != "" {
		cert, err := tls.LoadX509KeyPair(c.HubbleRelayTLSClientCertFile, c.HubbleRelayTLSClientKeyFile)
		if err != nil {
			return nil, fmt.Errorf("load --hubble-relay-tls-client-cert-file %s and its key: %w", c.HubbleRelayTLSClientCertFile, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return credentials.NewTLS(cfg), nil
}
