// Command render-manifests renders the Helm chart install/helm/cellium into
// install/kubernetes/cellium.yaml (`make manifests`), building helm first if
// it is not cached (test/harness EnsureHelm).
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"

	"github.com/cellium/cellium/install"
	"github.com/cellium/cellium/test/harness"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "render-manifests:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	wd, err := os.Getwd()
	if err != nil {
		return err
	}
	root, err := harness.RepoRoot(wd)
	if err != nil {
		return err
	}
	helm, err := harness.EnsureHelm(ctx, slog.New(slog.NewTextHandler(os.Stderr, nil)))
	if err != nil {
		return err
	}
	out, err := install.Render(ctx, helm, root)
	if err != nil {
		return err
	}
	dst := filepath.Join(root, install.ManifestsFile)
	if err := os.WriteFile(dst, out, 0o644); err != nil {
		return fmt.Errorf("write manifests: %w", err)
	}
	fmt.Println("wrote", install.ManifestsFile)
	return nil
}
