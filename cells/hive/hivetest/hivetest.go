// Package hivetest helps unit tests compose a partial hive: a few cells plus
// fakes, started and stopped within the test.
package hivetest

import (
	"context"
	"io"
	"log/slog"
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
