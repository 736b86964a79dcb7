// Command cellium-agent is the per-node cellium daemon.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/daemon"
	"github.com/cellium/cellium/daemon/bpfdatapath"
	"github.com/cellium/cellium/daemon/datapathmonitor"
	"github.com/cellium/cellium/daemon/healthendpoint"
	"github.com/cellium/cellium/daemon/hostlinks"
	"github.com/cellium/cellium/daemon/hostrouting"
	"github.com/cellium/cellium/daemon/nodeinit"
)

// agentCells are the agent's cells: the control plane and the datapath.
func agentCells() []hive.Cell {
	return []hive.Cell{daemon.Agent, hostlinks.Cell, hostrouting.Cell, healthendpoint.Cell, bpfdatapath.Cell, datapathmonitor.Cell}
}

func main() {
	cmd := daemon.NewCommand(agentCells()...)
	// The DaemonSet's init containers (the image has no shell).
	cmd.AddCommand(nodeinit.Commands()...)
	if err := cmd.ExecuteContext(context.Background()); err != nil {
		fmt.Fprintf(os.Stderr, "Error: %v\n", err)
		os.Exit(1)
	}
}
