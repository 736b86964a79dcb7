package nodediscovery

import (
	"fmt"
	"time"

	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/reconcilejob"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/statedb/nodes"
	"github.com/cellium/cellium/statedb/reconciler"
)

// The CiliumNode is mirrored with the generic reconciler from a one-row
// desired table rather than by a hand-written loop: it brings retries with
// backoff (Cilium gives up after 10 tries; we keep trying and report
// degraded health), the per-row status visible in GET /v1/statedb/local-node,
// and a periodic full reconciliation that repairs the object if someone
// edits it between the change-driven updates.
const (
	// fullReconcileInterval is how often the CiliumNode is checked even
	// when nothing changed.
	fullReconcileInterval = 10 * time.Minute
	retryMin, retryMax    = 200 * time.Millisecond, 30 * time.Second
)

// reconcilerParams are registerReconciler's inputs.
type reconcilerParams struct {
	hive.In

	Config    Config
	Table     statedb.RWTable[*nodes.LocalNode]
	Clientset k8s.Clientset
	Reconcile reconcilejob.Params
}

func registerReconciler(p reconcilerParams) error {
	if !p.Config.AutoCreateCiliumNodeResource {
		return nil
	}
	// Its job is "reconcile-ciliumnode".
	_, err := reconcilejob.New(p.Reconcile, reconciler.Config[*nodes.LocalNode]{
		Name:         "ciliumnode",
		Table:        p.Table,
		GetStatus:    func(n *nodes.LocalNode) reconciler.Status { return n.Status },
		SetStatus:    (*nodes.LocalNode).WithStatus,
		Operations:   &ciliumNodeTarget{cs: p.Clientset},
		FullInterval: fullReconcileInterval,
		RetryMin:     retryMin,
		RetryMax:     retryMax,
	}, func() error {
		if !p.Clientset.IsEnabled() {
			return fmt.Errorf("publish the CiliumNode: %w (or pass --auto-create-cilium-node-resource=false)", k8s.ErrNotConfigured)
		}
		return nil
	})
	return err
}
