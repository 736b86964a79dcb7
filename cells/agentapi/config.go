package agentapi

import "github.com/spf13/pflag"

// DefaultSocketPath is where the agent listens and the CLI connects.
const DefaultSocketPath = "/var/run/cellium/cellium.sock"

// Config is the API server's configuration.
type Config struct {
	// SocketPath is the unix socket of the API.
	SocketPath string
}

// DefaultConfig listens on DefaultSocketPath.
var DefaultConfig = Config{SocketPath: DefaultSocketPath}

// Flags registers --socket-path.
func (def Config) Flags(fs *pflag.FlagSet) {
	fs.String("socket-path", def.SocketPath, "Unix socket of the agent API")
}
