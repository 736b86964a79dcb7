package observer

import (
	"fmt"
	"net"
	"path/filepath"

	"github.com/spf13/pflag"

	"github.com/cellium/cellium/cells/agentapi"
)

// Config is the Hubble server's configuration; the flags are Cilium's.
type Config struct {
	// HubbleEventBufferCapacity is how many events the ring keeps.
	HubbleEventBufferCapacity int
	// HubbleSocketPath is the unix socket of the Hubble API; empty means
	// hubble.sock beside the agent API socket (--socket-path).
	HubbleSocketPath string
	// HubbleListenAddress is the TCP address of the Hubble API; empty
	// means no TCP listener.
	HubbleListenAddress string
	// HubbleTLSCertFile and HubbleTLSKeyFile are the TCP listener's
	// certificate and key (PEM).
	HubbleTLSCertFile string
	HubbleTLSKeyFile  string
	// HubbleTLSClientCAFiles, when set, make the TCP listener require a
	// client certificate signed by one of these CAs (mTLS).
	HubbleTLSClientCAFiles []string
	// HubbleDisableTLS allows the TCP listener without TLS.
	HubbleDisableTLS bool
}

// DefaultConfig keeps 4095 events (Cilium's default) and listens on the
// unix socket only.
var DefaultConfig = Config{HubbleEventBufferCapacity: 4095}

// Flags registers the --hubble-* flags of the Hubble server.
func (def Config) Flags(fs *pflag.FlagSet) {
	fs.Int("hubble-event-buffer-capacity", def.HubbleEventBufferCapacity,
		fmt.Sprintf("Flows and lost events the Hubble ring buffer keeps: one less than a power of two, at most %d (1, 3, ..., 2047, 4095, ...)", MaxCapacity))
	fs.String("hubble-socket-path", def.HubbleSocketPath,
		"Unix socket of the Hubble API (hubble --server unix://...); empty: hubble.sock beside --socket-path, /var/run/cellium/hubble.sock by default")
	fs.String("hubble-listen-address", def.HubbleListenAddress,
		`TCP address of the Hubble API for hubble-relay, e.g. ":4244"; empty: no TCP listener. Needs --hubble-tls-cert-file and --hubble-tls-key-file unless --hubble-disable-tls`)
	fs.String("hubble-tls-cert-file", def.HubbleTLSCertFile, "PEM certificate of the Hubble TCP listener, issued for <node>.<cluster>.hubble-grpc.cilium.io (re-read at each TLS handshake)")
	fs.String("hubble-tls-key-file", def.HubbleTLSKeyFile, "PEM private key of --hubble-tls-cert-file")
	fs.StringSlice("hubble-tls-client-ca-files", def.HubbleTLSClientCAFiles, "PEM CA certificates of the clients (hubble-relay) the TCP listener accepts; set means mutual TLS")
	fs.Bool("hubble-disable-tls", def.HubbleDisableTLS, "Serve the Hubble API on --hubble-listen-address without TLS (anyone who reaches the port can read every flow)")
}

// Validate implements hive.Validator.
func (c Config) Validate() error {
	if err := CheckCapacity(c.HubbleEventBufferCapacity); err != nil {
		return fmt.Errorf("invalid --hubble-event-buffer-capacity=%d: the capacity must be one less than an integer power of two: %w",
			c.HubbleEventBufferCapacity, err)
	}
	if (c.HubbleTLSCertFile == "") != (c.HubbleTLSKeyFile == "") {
		return fmt.Errorf("--hubble-tls-cert-file and --hubble-tls-key-file go together: give both or neither")
	}
	if c.HubbleListenAddress == "" {
		return nil
	}
	if _, _, err := net.SplitHostPort(c.HubbleListenAddress); err != nil {
		return fmt.Errorf("invalid --hubble-listen-address=%q: give host:port or :port, e.g. \":4244\": %w", c.HubbleListenAddress, err)
	}
	if !c.HubbleDisableTLS && c.HubbleTLSCertFile == "" {
		return fmt.Errorf("--hubble-listen-address=%s serves every flow over TCP, which needs TLS: give --hubble-tls-cert-file and --hubble-tls-key-file (and --hubble-tls-client-ca-files for mutual TLS), or pass --hubble-disable-tls to serve it in plain text",
			c.HubbleListenAddress)
	}
	return nil
}

// socketPath is the unix socket to listen on.
func (c Config) socketPath(api agentapi.Config) string {
	if c.HubbleSocketPath != "" {
		return c.HubbleSocketPath
	}
	return filepath.Join(filepath.Dir(api.SocketPath), "hubble.sock")
}

// peerPort is the port peers are announced with.
func (c Config) peerPort() int {
	if _, p, err := net.SplitHostPort(c.HubbleListenAddress); err == nil {
		if n, err := net.LookupPort("tcp", p); err == nil && n != 0 {
			return n
		}
	}
	return DefaultServerPort
}
