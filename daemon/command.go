package daemon

import (
	"github.com/spf13/cobra"

	"github.com/cellium/cellium/cells/hive"
)

// NewCommand builds the cellium-agent command over the given cells.
func NewCommand(cells ...hive.Cell) *cobra.Command {
	return hive.NewDaemonCommand("cellium-agent", "Run the cellium agent: per-node networking and network policy", cells...)
}
