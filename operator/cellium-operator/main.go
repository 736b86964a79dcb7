// Command cellium-operator is the cluster-wide cellium coordinator.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/cellium/cellium/operator"
)

func main() {
	if err := operator.NewCommand(operator.Operator).ExecuteContext(context.Background()); err != nil {
		fmt.Fprintf(os.Stderr, "Error: %v\n", err)
		os.Exit(1)
	}
}
