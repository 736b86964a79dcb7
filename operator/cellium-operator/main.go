// Command cellium-operator is the cluster-wide cellium coordinator.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/cellium/cellium/daemon"
	"github.com/cellium/cellium/operator"
)

func main() {
	cmd := daemon.NewDaemonCommand("cellium-operator", "Run the cellium operator: CRDs, IPAM and garbage collection for the cluster", operator.Operator)
	if err := cmd.ExecuteContext(context.Background()); err != nil {
		fmt.Fprintf(os.Stderr, "Error: %v\n", err)
		os.Exit(1)
	}
}
