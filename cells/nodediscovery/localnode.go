package nodediscovery

import (
	"context"
	"fmt"

	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/statedb/nodes"
)

// LocalNode reads what the agent knows about its own node: name,
// InternalIP (a CiliumEndpoint's status.networking.node), router IP, pod
// CIDRs and health IP. It reads the local-node table; safe for concurrent
// use.
type LocalNode interface {
	// Get returns the local node as known now, nil until the Node object
	// has an InternalIP, and a channel closed when that changes. The
	// returned row must not be modified.
	Get() (*nodes.LocalNode, <-chan struct{})
	// Wait returns the local node once its InternalIP is known.
	//
	// Possible errors: ctx's error, wrapped with what was missing.
	Wait(ctx context.Context) (*nodes.LocalNode, error)
}

type localNode struct {
	name  string
	db    *statedb.DB
	table statedb.Table[*nodes.LocalNode]
}

func newLocalNode(name k8s.NodeName, db *statedb.DB, table statedb.Table[*nodes.LocalNode]) LocalNode {
	return &localNode{name: string(name), db: db, table: table}
}

func (l *localNode) Get() (*nodes.LocalNode, <-chan struct{}) {
	n, _, watch, found := l.table.GetWatch(l.db.ReadTxn(), nodes.LocalNodeNameIndex.Query(l.name))
	if !found {
		return nil, watch
	}
	return n, watch
}

func (l *localNode) Wait(ctx context.Context) (*nodes.LocalNode, error) {
	for {
		n, watch := l.Get()
		if n != nil && n.InternalIP.IsValid() {
			return n, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for the InternalIP of node %s (from its Node object): %w", l.name, ctx.Err())
		case <-watch:
		}
	}
}
