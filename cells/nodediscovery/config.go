package nodediscovery

import "github.com/spf13/pflag"

// Config is the cell's configuration.
type Config struct {
	// AutoCreateCiliumNodeResource makes the agent create and update its
	// node's CiliumNode; off, something else must (the local node is still
	// computed and the health IP still allocated).
	AutoCreateCiliumNodeResource bool
}

// DefaultConfig publishes the CiliumNode, as Cilium does by default.
var DefaultConfig = Config{AutoCreateCiliumNodeResource: true}

// Flags registers --auto-create-cilium-node-resource (Cilium's name).
func (def Config) Flags(fs *pflag.FlagSet) {
	fs.Bool("auto-create-cilium-node-resource", def.AutoCreateCiliumNodeResource,
		"Create and update this node's CiliumNode (addresses, health IP, boot ID)")
}
