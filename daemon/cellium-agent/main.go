// Command cellium-agent is the per-node cellium daemon.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/cellium/cellium/daemon"
)

func main() {
	if err := daemon.NewCommand(daemon.Agent).ExecuteContext(context.Background()); err != nil {
		fmt.Fprintf(os.Stderr, "Error: %v\n", err)
		os.Exit(1)
	}
}
