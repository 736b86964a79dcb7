// Command cellium-agent is the per-node cellium daemon.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/cellium/cellium/daemon"
	"github.com/cellium/cellium/daemon/bpfdatapath"
	"github.com/cellium/cellium/daemon/datapathmonitor"
	"github.com/cellium/cellium/daemon/healthendpoint"
	"github.com/cellium/cellium/daemon/hostlinks"
	"github.com/cellium/cellium/daemon/hostrouting"
	"github.com/cellium/cellium/daemon/nodeinit"
)

func main() {
	cmd := daemon.NewCommand(daemon.Agent, hostlinks.Cell, hostrouting.Cell, healthendpoint.Cell, bpfdatapath.Cell, datapathmonitor.Cell)
	// The DaemonSet's init containers (the image has no shell).
	cmd.AddCommand(nodeinit.Commands()...)
	if err := cmd.ExecuteContext(context.Background()); err != nil {
		fmt.Fprintf(os.Stderr, "Error: %v\n", err)
		os.Exit(1)
	}
}
