// Package crdregister is the operator cell that creates or updates the
// cilium.io CRDs at start and waits until each is Established.
package crdregister

import "github.com/cellium/cellium/cells/hive"

// Cell registers the CRDs unless --skip-crd-creation is set.
var Cell = hive.Module("crd-register", "Registers the cilium.io CRDs",
	hive.Config(DefaultConfig),
	// A start hook: the operator's controllers start only after the CRDs serve.
	hive.Invoke(registerHook),
)
