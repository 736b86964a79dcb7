package controlplane

import (
	"context"
	"testing"

	"github.com/cilium/hive/script"
	"github.com/cilium/hive/script/scripttest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestScripts runs testdata/*.txtar, each against an agent of its own.
// The flags after "#!" on a script's first line are the agent's.
// go test -scripttest.update rewrites the expected files.
func TestScripts(t *testing.T) {
	scripttest.Test(t, context.Background(), func(tb testing.TB, args []string) *script.Engine {
		return New(tb, args).Engine()
	}, nil, "testdata/*.txtar")
}
