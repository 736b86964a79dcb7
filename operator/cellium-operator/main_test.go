package main

import (
	"testing"

	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/operator"
)

// As the agent's: the operator's modules, tables and reconcilers on the
// architecture page are generated from its hive with default flags.
func TestArchitecturePage(t *testing.T) {
	inv, err := hivetest.New(t, nil, operator.Operator).Inventory()
	if err != nil {
		t.Fatal(err)
	}
	hivetest.CheckDocSection(t, "../../Documentation/concepts/architecture.md", "cellium-operator", inv.Markdown("cellium-operator"))
}
