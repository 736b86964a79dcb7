// Command cellium-agent is the per-node cellium daemon.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/cellium/cellium/daemon"
	"github.com/cellium/cellium/daemon/bpfmaps"
	"github.com/cellium/cellium/daemon/hostlinks"
	"github.com/cellium/cellium/daemon/hostrouting"
)

func main() {
	if err := daemon.NewCommand(daemon.Agent, hostlinks.Cell, hostrouting.Cell, bpfmaps.Cell).ExecuteContext(context.Background()); err != nil {
		fmt.Fprintf(os.Stderr, "Error: %v\n", err)
		os.Exit(1)
	}
}
