package observer

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"runtime/debug"
	"sync"
	"time"

	observerpb "github.com/cilium/cilium/api/v1/observer"
	peerpb "github.com/cilium/cilium/api/v1/peer"
	"github.com/cilium/statedb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/cellium/cellium/cells/agentapi"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hubble"
	"github.com/cellium/cellium/cells/identity"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/statedb/nodes"
)

// Cell keeps the flows in the ring and serves Hubble's Observer and Peer
// gRPC services on the Hubble socket and, if configured, on TCP.
var Cell = hive.Module("hubble-observer", "Hubble ring buffer and its Observer and Peer gRPC services",
	// --hubble-event-buffer-capacity, --hubble-socket-path, --hubble-listen-address, --hubble-tls-*.
	hive.Config(DefaultConfig),
	// The ring: a Sink of the flow producer.
	hive.Provide(newRing),
	// The gRPC servers, listening from start to stop.
	hive.Invoke(registerServers),
)

type ringOut struct {
	hive.Out
	Ring *Ring
	Sink hubble.Sink `group:"hubble-sinks"`
}

func newRing(c Config) (ringOut, error) {
	r, err := NewRing(c.HubbleEventBufferCapacity)
	if err != nil {
		return ringOut{}, err
	}
	return ringOut{Ring: r, Sink: r}, nil
}

// ServersParams is what registerServers needs.
type ServersParams struct {
	hive.In
	Config Config
	// Hubble says whether the agent makes flows at all (--enable-hubble):
	// without them there is nothing to serve.
	Hubble    hubble.Config
	API       agentapi.Config
	Ring      *Ring
	NodeName  k8s.NodeName
	Cluster   identity.ClusterName
	DB        *statedb.DB
	Nodes     statedb.Table[*nodes.Node]
	Lifecycle hive.Lifecycle
	Log       *slog.Logger
}

// observerHealthName is the Observer's name in gRPC's health service,
// Hubble's.
const observerHealthName = "hubble.server.Observer"

// stopGrace bounds a graceful stop of the gRPC servers.
const stopGrace = 5 * time.Second

func registerServers(p ServersParams) {
	if !p.Hubble.EnableHubble {
		p.Log.Info("Hubble is off (--enable-hubble=false): no Observer or Peer service")
		return
	}
	var servers []*grpc.Server
	var wg sync.WaitGroup
	obs := NewServer(p.Ring, FullNodeName(string(p.NodeName), string(p.Cluster)), Version(), p.Log,
		WithLostEventSendInterval(p.Hubble.HubbleLostEventSendInterval))
	peers := NewPeerServer(p.DB, p.Nodes, string(p.Cluster), p.Config.peerPort(), !p.Config.HubbleDisableTLS)
	// hubble status asks the health service about the Observer by this
	// name.
	healthSvc := health.NewServer()
	healthSvc.SetServingStatus(observerHealthName, healthpb.HealthCheckResponse_SERVING)
	newServer := func(opts ...grpc.ServerOption) *grpc.Server {
		s := grpc.NewServer(opts...)
		observerpb.RegisterObserverServer(s, obs)
		peerpb.RegisterPeerServer(s, peers)
		healthpb.RegisterHealthServer(s, healthSvc)
		return s
	}
	serve := func(s *grpc.Server, ln net.Listener) {
		servers = append(servers, s)
		wg.Go(func() {
			if err := s.Serve(ln); err != nil {
				p.Log.Error("Hubble server stopped", "address", ln.Addr().String(), "error", err)
			}
		})
	}
	stopAll := func() {
		healthSvc.Shutdown()
		obs.Shutdown()
		peers.Shutdown()
		for _, s := range servers {
			done := make(chan struct{})
			go func() { s.GracefulStop(); close(done) }()
			select {
			case <-done:
			case <-time.After(stopGrace):
				s.Stop()
				<-done
			}
		}
		wg.Wait()
	}
	p.Lifecycle.Append(hive.Hook{
		Name: "hubble-servers",
		OnStart: func(context.Context) (err error) {
			defer func() {
				if err != nil {
					stopAll()
				}
			}()
			path := p.Config.socketPath(p.API)
			ln, err := listenUnix(path)
			if err != nil {
				return err
			}
			serve(newServer(), ln)
			p.Log.Info("Hubble API listening", "socket", path)
			if addr := p.Config.HubbleListenAddress; addr != "" {
				var opts []grpc.ServerOption
				if !p.Config.HubbleDisableTLS {
					tlsCfg, err := serverTLS(p.Config)
					if err != nil {
						return err
					}
					opts = append(opts, grpc.Creds(credentials.NewTLS(tlsCfg)))
				}
				tcp, err := net.Listen("tcp", addr)
				if err != nil {
					return fmt.Errorf("listen on --hubble-listen-address=%s: %w", addr, err)
				}
				serve(newServer(opts...), tcp)
				p.Log.Info("Hubble API listening", "address", tcp.Addr().String(), "tls", !p.Config.HubbleDisableTLS)
			}
			return nil
		},
		OnStop: func(context.Context) error {
			stopAll()
			return nil
		},
	})
}

// Version is what ServerStatus reports: cellium and the module version
// the binary was built from.
func Version() string {
	v := "(devel)"
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		v = bi.Main.Version
	}
	return "cellium " + v
}
