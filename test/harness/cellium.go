package harness

import (
	"context"
	"fmt"
	"os"
	"os/exec"
)

// CelliumCommands are the packages of cellium's daemons, as BuildCellium
// takes them.
var CelliumCommands = []string{"./daemon/cellium-agent", "./operator/cellium-operator"}

// BuildCellium builds the given commands of this repository (packages
// relative to its root, CelliumCommands when none) into dir with the go
// command on $PATH, for tests and tools that run the real binaries against
// a harness cluster (test/integration, test/scale). The build inherits the
// caller's niceness.
//
// Errors: the repository root cannot be found; the build fails (the
// error carries the compiler's output).
func BuildCellium(ctx context.Context, dir string, pkgs ...string) error {
	if len(pkgs) == 0 {
		pkgs = CelliumCommands
	}
	wd, err := os.Getwd()
	if err != nil {
		return fmt.Errorf("build cellium: %w", err)
	}
	root, err := RepoRoot(wd)
	if err != nil {
		return fmt.Errorf("build cellium: %w", err)
	}
	cmd := exec.CommandContext(ctx, "go", append([]string{"build", "-o", dir + "/"}, pkgs...)...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build cellium: go build: %w\n%s", err, out)
	}
	return nil
}
