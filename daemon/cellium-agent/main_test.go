package main

import (
	"testing"

	"github.com/cellium/cellium/cells/hive/hivetest"
)

// The architecture page's list of the agent's modules, tables and
// reconcilers is generated from the agent's hive with its default flags,
// so it cannot go stale: a new cell, table or reconciler fails this test
// until the page is regenerated (CELLIUM_UPDATE_DOCS=1).
func TestArchitecturePage(t *testing.T) {
	inv, err := hivetest.New(t, nil, agentCells()...).Inventory()
	if err != nil {
		t.Fatal(err)
	}
	hivetest.CheckDocSection(t, "../../Documentation/concepts/architecture.md", "cellium-agent", inv.Markdown("cellium-agent"))
}
