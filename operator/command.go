package operator

import (
	"github.com/spf13/cobra"

	"github.com/cellium/cellium/cells/hive"
)

// NewCommand builds the cellium-operator command over the given cells.
func NewCommand(cells ...hive.Cell) *cobra.Command {
	return hive.NewDaemonCommand("cellium-operator", "Run the cellium operator: CRDs, IPAM and garbage collection for the cluster", cells...)
}
