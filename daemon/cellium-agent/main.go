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
)

func main() {
	if err := daemon.NewCommand(daemon.Agent, hostlinks.Cell, hostrouting.Cell, healthendpoint.Cell, bpfdatapath.Cell, datapathmonitor.Cell).ExecuteContext(context.Background()); err != nil {
		fmt.Fprintf(os.Stderr, "Error: %v\n", err)
		os.Exit(1)
	}
}
