package healthep

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/cilium/statedb"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/health"
	"github.com/cellium/cellium/statedb/nodes"
	"github.com/cellium/cellium/statedb/reconciler"
	"github.com/cellium/cellium/statedb/routes"
	"github.com/cellium/cellium/statedb/tables"
)

// Names are the names of what Ops makes. The zero Names are Cilium's.
type Names struct {
	// NetnsDir is where the namespace is pinned: /var/run/netns.
	NetnsDir string
	// NetnsName is the namespace's name: health.NetnsName.
	NetnsName string
	// HostIfName and IfName name the veth's ends: health.HostIfName and
	// health.IfName.
	HostIfName, IfName string
	// ContainerID labels the veth: health.ContainerID.
	ContainerID string
	// Port is the responder's: health.Port.
	Port int
}

// WithDefaults fills the empty fields with Cilium's names.
func (n Names) WithDefaults() Names {
	def := func(s *string, d string) {
		if *s == "" {
			*s = d
		}
	}
	def(&n.NetnsDir, "/var/run/netns")
	def(&n.NetnsName, health.NetnsName)
	def(&n.HostIfName, health.HostIfName)
	def(&n.IfName, health.IfName)
	def(&n.ContainerID, health.ContainerID)
	if n.Port == 0 {
		n.Port = health.Port
	}
	return n
}

// NetnsPath is NetnsDir/NetnsName.
func (n Names) NetnsPath() string { return filepath.Join(n.NetnsDir, n.NetnsName) }

// Desired is the health-netns row for the health endpoint row ep and the
// local node (either may be nil): nil while the endpoint has no IPv4
// address, is going away, or the node has no router IP.
func Desired(names Names, ep *endpoints.Endpoint, local *nodes.LocalNode) *health.Netns {
	if ep == nil || !ep.IPv4.Is4() || local == nil || !local.RouterIP.Is4() {
		return nil
	}
	switch ep.State {
	case ciliumv2.EndpointStateDisconnecting, ciliumv2.EndpointStateDisconnected:
		return nil
	}
	names = names.WithDefaults()
	return &health.Netns{
		NetnsPath: names.NetnsPath(), HostIfName: names.HostIfName, IfName: names.IfName,
		ContainerID: names.ContainerID, IPv4: ep.IPv4, Gateway: local.RouterIP, Port: names.Port,
	}
}

// Deriver keeps the health-netns table equal to Desired of the endpoints
// and local-node tables.
type Deriver struct {
	names     Names
	db        *statedb.DB
	endpoints statedb.Table[*endpoints.Endpoint]
	local     statedb.Table[*nodes.LocalNode]
	netns     statedb.RWTable[*health.Netns]
	init      tables.InitGate
}

// NewDeriver registers the deriver as the health-netns table's
// initializer (done once the endpoints table is: the restore decided).
func NewDeriver(names Names, db *statedb.DB, eps statedb.Table[*endpoints.Endpoint], local statedb.Table[*nodes.LocalNode], netns statedb.RWTable[*health.Netns]) *Deriver {
	wtxn := db.WriteTxn(netns)
	done := netns.RegisterInitializer(wtxn, "health-endpoint")
	wtxn.Commit()
	return &Deriver{names: names, db: db, endpoints: eps, local: local, netns: netns, init: tables.NewInitGate(done)}
}

// Run derives until ctx ends, each time the endpoints or the local node
// change.
func (d *Deriver) Run(ctx context.Context, h reconciler.Health) {
	for {
		rtxn := d.db.ReadTxn()
		eps, epWatch := d.endpoints.AllWatch(rtxn)
		var hep *endpoints.Endpoint
		for ep := range eps {
			if ep.Health {
				hep = ep
				break
			}
		}
		var local *nodes.LocalNode
		nodesIter, nodeWatch := d.local.AllWatch(rtxn)
		for n := range nodesIter {
			local = n
			break
		}
		var want []*health.Netns
		if n := Desired(d.names, hep, local); n != nil {
			want = append(want, n)
		}
		var initWatch <-chan struct{}
		wtxn := d.db.WriteTxn(d.netns)
		if _, err := routes.Sync(wtxn, d.netns, want, func(n *health.Netns) reconciler.Status { return n.Status }); err != nil {
			wtxn.Abort()
			h.Degraded("write the desired health endpoint", err)
		} else {
			if d.init.Closed() {
				if ok, w := d.endpoints.Initialized(rtxn); ok {
					d.init.Open(wtxn)
				} else {
					initWatch = w // wake up when the restore is done
				}
			}
			wtxn.Commit()
			if len(want) == 0 {
				h.OK("waiting for the health endpoint's IP and the router IP")
			} else {
				h.OK(fmt.Sprintf("health endpoint %s in %s", want[0].IPv4, want[0].NetnsPath))
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-epWatch:
		case <-nodeWatch:
		case <-initWatch:
		}
	}
}

// Reconciler is the configuration of the health-netns reconciler (name
// "health-netns") with target ops.
func Reconciler(netns statedb.RWTable[*health.Netns], ops *Ops) reconciler.Config[*health.Netns] {
	return reconciler.Config[*health.Netns]{
		Name: health.NetnsTableName, Table: netns, Operations: ops,
		GetStatus: func(n *health.Netns) reconciler.Status { return n.Status },
		SetStatus: (*health.Netns).WithStatus,
	}
}
