// Package hivetest helps unit tests compose a partial hive: a few cells plus
// fakes, started and stopped within the test.
package hivetest

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cellium/cellium/cells/hive"
)

// Logger returns a logger that writes to the test's log.
func Logger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(string(p))
	return len(p), nil
}

// New creates a hive whose logger writes to the test log and which reads no
// environment variables. args are command-line flags ("--k8s-client-qps=5").
func New(t testing.TB, args []string, cells ...hive.Cell) *hive.Hive {
	t.Helper()
	h := hive.NewWithOptions(hive.Options{
		Logger:    Logger(t),
		LookupEnv: func(string) (string, bool) { return "", false },
	}, cells...)
	if err := h.Flags().Parse(args); err != nil {
		t.Fatalf("parse flags %v: %v", args, err)
	}
	return h
}

// Start creates and starts a hive and stops it when the test ends.
func Start(t testing.TB, args []string, cells ...hive.Cell) *hive.Hive {
	t.Helper()
	h := New(t, args, cells...)
	if err := h.Start(context.Background()); err != nil {
		t.Fatalf("start hive: %v", err)
	}
	t.Cleanup(func() {
		if err := h.Stop(context.Background()); err != nil {
			t.Errorf("stop hive: %v", err)
		}
	})
	return h
}

// Capture is a cell that stores the graph's T into *dst when the hive is
// populated, so the test can read values out of the graph.
func Capture[T any](dst *T) hive.Cell {
	return hive.Invoke(func(v T) { *dst = v })
}

// Discard is a logger that drops everything.
func Discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// UpdateDocsEnv is the environment variable that makes CheckDocSection
// rewrite the section instead of failing: CELLIUM_UPDATE_DOCS=1.
const UpdateDocsEnv = "CELLIUM_UPDATE_DOCS"

// CheckDocSection fails the test when the generated section name of the
// Markdown file path (the lines between "<!-- BEGIN generated: name -->"
// and "<!-- END generated: name -->") differs from content, and says how
// to regenerate it; with UpdateDocsEnv=1 it rewrites the section instead.
func CheckDocSection(t testing.TB, path, name, content string) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	begin, end := "<!-- BEGIN generated: "+name+" -->\n", "<!-- END generated: "+name+" -->"
	doc := string(raw)
	i, j := strings.Index(doc, begin), strings.Index(doc, end)
	if i < 0 || j < i {
		t.Fatalf("%s has no section %q: add the lines %q and %q where it belongs", path, name, strings.TrimSpace(begin), end)
	}
	cur := doc[i+len(begin) : j]
	if cur == content {
		return
	}
	if os.Getenv(UpdateDocsEnv) == "1" {
		updated := doc[:i+len(begin)] + content + doc[j:]
		if err := os.WriteFile(path, []byte(updated), 0o644); err != nil {
			t.Fatalf("update %s: %v", path, err)
		}
		t.Logf("updated section %q of %s", name, path)
		return
	}
	t.Errorf("section %q of %s is stale; regenerate it with %s=1 go test -run '%s' ./%s\n--- in the file:\n%s\n--- generated:\n%s",
		name, path, UpdateDocsEnv, t.Name(), callerPackageDir(), cur, content)
}

// callerPackageDir is the test's package directory relative to the
// repository root (the working directory of a go test is its package).
func callerPackageDir() string {
	wd, err := os.Getwd()
	if err != nil {
		return "..."
	}
	dir := wd
	for d := wd; d != filepath.Dir(d); d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			if rel, err := filepath.Rel(d, wd); err == nil {
				dir = rel
			}
			break
		}
	}
	return dir
}

// NopHealth is a hive.Health that discards every report, for a job run
// by hand in a test that does not look at its health.
type NopHealth struct{}

var _ hive.Health = NopHealth{}

// OK discards the report.
func (NopHealth) OK(string) {}

// Degraded discards the report.
func (NopHealth) Degraded(string, error) {}

// Stopped discards the report.
func (NopHealth) Stopped(string) {}

// Scope returns h: the sub-parts' reports are discarded too.
func (h NopHealth) Scope(string) hive.Health { return h }
