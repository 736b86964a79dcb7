package pprof

import (
	"github.com/spf13/pflag"
)

// AgentConfig is the agent's profiling configuration (Cilium's agent
// flags).
type AgentConfig struct {
	// Pprof serves the profiles.
	Pprof bool
	// PprofAddress is the address (host name or IP) to listen on.
	PprofAddress string
	// PprofPort is the TCP port to listen on.
	PprofPort uint16
}

// DefaultAgentConfig is Cilium's agent default: off, localhost:6060.
var DefaultAgentConfig = AgentConfig{Pprof: false, PprofAddress: "localhost", PprofPort: 6060}

// Flags registers --pprof, --pprof-address and --pprof-port.
func (def AgentConfig) Flags(fs *pflag.FlagSet) {
	fs.Bool("pprof", def.Pprof, "Enable serving pprof debugging API")
	fs.String("pprof-address", def.PprofAddress, "Address that pprof listens on")
	fs.Uint16("pprof-port", def.PprofPort, "Port that pprof listens on")
}

func (c AgentConfig) settings() settings {
	return settings{enabled: c.Pprof, address: c.PprofAddress, port: c.PprofPort,
		flag: "--pprof-address/--pprof-port"}
}

// OperatorConfig is the operator's profiling configuration: Cilium's
// operator prefixes the flags with "operator-".
type OperatorConfig struct {
	// OperatorPprof serves the profiles.
	OperatorPprof bool
	// OperatorPprofAddress is the address (host name or IP) to listen on.
	OperatorPprofAddress string
	// OperatorPprofPort is the TCP port to listen on.
	OperatorPprofPort uint16
}

// DefaultOperatorConfig is Cilium's operator default: off,
// localhost:6061.
var DefaultOperatorConfig = OperatorConfig{OperatorPprof: false, OperatorPprofAddress: "localhost", OperatorPprofPort: 6061}

// Flags registers --operator-pprof, --operator-pprof-address and
// --operator-pprof-port.
func (def OperatorConfig) Flags(fs *pflag.FlagSet) {
	fs.Bool("operator-pprof", def.OperatorPprof, "Enable serving pprof debugging API")
	fs.String("operator-pprof-address", def.OperatorPprofAddress, "Address that pprof listens on")
	fs.Uint16("operator-pprof-port", def.OperatorPprofPort, "Port that pprof listens on")
}

func (c OperatorConfig) settings() settings {
	return settings{enabled: c.OperatorPprof, address: c.OperatorPprofAddress, port: c.OperatorPprofPort,
		flag: "--operator-pprof-address/--operator-pprof-port"}
}

// settings is either configuration, without the flag prefixes.
type settings struct {
	enabled bool
	address string
	port    uint16
	// flag names the address flags in errors.
	flag string
}
