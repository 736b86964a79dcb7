package bpf

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cellium/cellium/test/privileged"
)

// TestGeneratedBPFUpToDate rebuilds the programs with the //go:generate
// line of doc.go into a temporary directory and compares the result with
// the committed files byte for byte. Without clang-19 and llvm-strip-19 it
// skips, unless CELLIUM_REQUIRE_PRIVILEGED=1 (CI) makes that a failure.
func TestGeneratedBPFUpToDate(t *testing.T) {
	if testing.Short() {
		t.Skip("rebuilds the BPF object; skipped in -short")
	}
	for _, tool := range []string{"clang-19", "llvm-strip-19"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv(privileged.EnvVar) == "1" {
				t.Fatalf("%s not found and %s=1: run `make deps`", tool, privileged.EnvVar)
			}
			t.Skipf("%s not found (run `make deps`); cannot check the generated BPF files", tool)
		}
	}
	out := t.TempDir()
	var names []string
	for _, args := range generateArgs(t) {
		// bpf2go's flags end at the first positional argument (the stem).
		cmdArgs := append([]string{"run", args[0], "-output-dir", out}, args[1:]...)
		cmd := exec.Command("go", cmdArgs...)
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("bpf2go: %v\n%s", err, b)
		}
		stem := strings.ToLower(bpf2goStem(t, args))
		names = append(names, stem+"_bpfel.go", stem+"_bpfel.o")
	}
	for _, name := range names {
		want, err := os.ReadFile(filepath.Join(out, name))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is stale: run `make bpf` and commit the result", name)
		}
	}
}

// bpf2goStem returns the stem (the first positional argument) of a
// bpf2go command line: every flag before it takes a value.
func bpf2goStem(t *testing.T, args []string) string {
	t.Helper()
	for i := 1; i < len(args); i++ {
		if !strings.HasPrefix(args[i], "-") {
			return args[i]
		}
		i++ // the flag's value
	}
	t.Fatalf("bpf2go line %v has no stem", args)
	return ""
}

// generateArgs returns the arguments of each bpf2go //go:generate line
// after `go run`.
func generateArgs(t *testing.T) [][]string {
	t.Helper()
	src, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	const prefix = "//go:generate go run "
	var out [][]string
	for line := range strings.SplitSeq(string(src), "\n") {
		if rest, ok := strings.CutPrefix(line, prefix); ok && strings.Contains(rest, "bpf2go") {
			out = append(out, strings.Fields(rest))
		}
	}
	if len(out) == 0 {
		t.Fatal("doc.go has no bpf2go //go:generate line")
	}
	return out
}
