// Command cellium is the command line of the cellium agent: it inspects
// the local agent over its API socket (see package cli).
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/cellium/cellium/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Run(ctx, os.Args[1:], cli.Options{})
	stop()
	os.Exit(code)
}
