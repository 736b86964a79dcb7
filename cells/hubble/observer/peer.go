package observer

import (
	"net"
	"strconv"
	"strings"

	peerpb "github.com/cilium/cilium/api/v1/peer"
	"github.com/cilium/statedb"

	"github.com/cellium/cellium/statedb/nodes"
)

// DefaultServerPort is the Hubble server's TCP port (Cilium's 4244), the
// port peers are announced with when --hubble-listen-address gives none.
const DefaultServerPort = 4244

// defaultClusterName is the cluster name whose nodes Hubble names without
// a cluster prefix.
const defaultClusterName = "default"

// PeerServer implements Hubble's peer.Peer service from the nodes table:
// hubble-relay learns every node's Hubble address from it.
type PeerServer struct {
	peerpb.UnimplementedPeerServer
	stopper
	db      *statedb.DB
	nodes   statedb.Table[*nodes.Node]
	cluster string
	port    int
	tls     bool
}

// NewPeerServer announces the nodes of tbl at port; with tls, each
// notification carries the TLS server name the node's certificate has.
func NewPeerServer(db *statedb.DB, tbl statedb.Table[*nodes.Node], cluster string, port int, tls bool) *PeerServer {
	return &PeerServer{stopper: newStopper(), db: db, nodes: tbl, cluster: cluster, port: port, tls: tls}
}

// TLSServerName is the name a node's Hubble server certificate is issued
// for, as Cilium builds it: <node>.<cluster>.hubble-grpc.cilium.io, dots
// in the node and cluster names turned into dashes.
func TLSServerName(node, cluster string) string {
	if node == "" {
		return ""
	}
	if cluster == "" {
		cluster = defaultClusterName
	}
	return strings.ReplaceAll(node, ".", "-") + "." + strings.ReplaceAll(cluster, ".", "-") + ".hubble-grpc.cilium.io"
}

// FullNodeName is the name Hubble gives a node: its name in the default
// cluster, cluster/name elsewhere.
func FullNodeName(node, cluster string) string {
	if cluster == "" || cluster == defaultClusterName {
		return node
	}
	return cluster + "/" + node
}

// notification describes node n as a PEER_ADDED notification.
func (p *PeerServer) notification(n *nodes.Node) *peerpb.ChangeNotification {
	cn := &peerpb.ChangeNotification{Name: FullNodeName(n.Name, p.cluster), Type: peerpb.ChangeNotificationType_PEER_ADDED}
	ip, ok := n.Address(nodes.AddressInternalIP)
	if !ok {
		ip, ok = n.Address(nodes.AddressExternalIP)
	}
	if ok {
		cn.Address = net.JoinHostPort(ip.String(), strconv.Itoa(p.port))
	}
	if p.tls {
		cn.Tls = &peerpb.TLS{ServerName: TLSServerName(n.Name, p.cluster)}
	}
	return cn
}

// Notify implements peer.PeerServer: PEER_ADDED for every node, then
// PEER_ADDED, PEER_UPDATED (its address or TLS name changed) and
// PEER_DELETED as the nodes table changes, until the client leaves.
func (p *PeerServer) Notify(_ *peerpb.NotifyRequest, stream peerpb.Peer_NotifyServer) error {
	ctx, release := p.streamContext(stream.Context())
	defer release()
	known := map[string]*peerpb.ChangeNotification{}
	for {
		all, watch := p.nodes.AllWatch(p.db.ReadTxn())
		now := map[string]*peerpb.ChangeNotification{}
		for n := range all {
			now[n.Name] = p.notification(n)
		}
		for name, cn := range now {
			old, ok := known[name]
			switch {
			case !ok:
			case old.GetAddress() != cn.GetAddress() || old.GetTls().GetServerName() != cn.GetTls().GetServerName():
				cn.Type = peerpb.ChangeNotificationType_PEER_UPDATED
			default:
				continue
			}
			if err := stream.Send(cn); err != nil {
				return err
			}
		}
		for name, old := range known {
			if _, ok := now[name]; ok {
				continue
			}
			gone := &peerpb.ChangeNotification{Name: old.GetName(), Address: old.GetAddress(), Tls: old.GetTls(),
				Type: peerpb.ChangeNotificationType_PEER_DELETED}
			if err := stream.Send(gone); err != nil {
				return err
			}
		}
		known = now
		select {
		case <-watch:
		case <-ctx.Done():
			return nil
		}
	}
}
