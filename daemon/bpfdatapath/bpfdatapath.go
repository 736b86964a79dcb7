// Package bpfdatapath composes the agent's eBPF datapath under one switch,
// --enable-bpf-datapath, with one --bpf-root: the per-endpoint program
// loader (daemon/bpfloader) and the reconcilers of the ipcache, endpoint
// and policy maps the programs read (daemon/bpfmaps), and the socket load
// balancer (daemon/socklb). Only cellium-agent's
// main composes it, so that the daemon package does not link the datapath.
package bpfdatapath

import (
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/daemon/bpfloader"
	"github.com/cellium/cellium/daemon/bpfmaps"
	"github.com/cellium/cellium/daemon/hostrouting"
	"github.com/cellium/cellium/daemon/socklb"
	"github.com/cellium/cellium/datapath/bpfconfig"
	"github.com/cellium/cellium/datapath/lbmode"
	"github.com/cellium/cellium/datapath/loader"
	"github.com/cellium/cellium/datapath/maglev"
)

// Cell is the agent's eBPF datapath: its programs and maps pinned in
// <bpf-root>/cellium, attached in the agent's own network namespace.
var Cell = hive.Module("bpf-datapath", "eBPF programs on the pod veths and the maps they read",
	hive.Feature(bpfconfig.EnableFlag, bpfconfig.EnableDefault, bpfconfig.EnableUsage,
		// --bpf-root, shared by the loader and the map reconcilers.
		hive.Config(bpfconfig.DefaultConfig),
		bpfloader.Loader(loader.Netns{}, bpfloader.Sources{
			Spec:     loader.LoadSpec,
			OpenMaps: func(dir string) bpfloader.ClosableMaps { return loader.NewPinnedMaps(dir) },
		}),
		bpfmaps.Maps(bpfmaps.OpenPinned),
		// ClusterIPs translated at the socket (--bpf-lb-sock).
		socklb.Cell,
		// The uplink program of the kube-proxy replacement (the loader's
		// attach-nodeport job): on with --kube-proxy-replacement, on the
		// --devices.
		hive.Provide(NodePortConfig),
		// --bpf-lb-mode, --bpf-lb-dsr-dispatch: SNAT or DSR to remote
		// backends, checked against --routing-mode.
		hive.Config(lbmode.DefaultConfig),
		hive.Invoke(CheckLBMode),
	),
)

// NodePortParams are what NodePortConfig reads.
type NodePortParams struct {
	hive.In
	SocketLB socklb.Config
	// Maglev is --bpf-lb-algorithm and its table size and seed.
	Maglev maglev.Config
	// Routing is absent with --enable-endpoint-routes=false: the devices
	// are then detected.
	Routing hostrouting.Config `optional:"true"`
	// LBMode is --bpf-lb-mode (absent: snat).
	LBMode lbmode.Config `optional:"true"`
}

// NodePortConfig switches the uplink program (bpf/nodeport.c) with
// --kube-proxy-replacement and gives it the devices of --devices and,
// with --bpf-lb-algorithm=maglev, the Maglev table size and hash seed.
func NodePortConfig(p NodePortParams) *loader.NodePortConfig {
	c := &loader.NodePortConfig{KubeProxyReplacement: p.SocketLB.KPR(), Devices: p.Routing.Devices, LBMapMax: p.SocketLB.LBMapMax,
		ServicesInStack: !p.SocketLB.EnableSocketLB}
	if p.Maglev.Maglev() {
		c.MaglevTableSize, c.MaglevSeed = p.Maglev.TableSize, p.Maglev.Seed().Datapath()
	}
	c.LBMode = p.LBMode.Datapath()
	return c
}

// CheckLBMode refuses --bpf-lb-mode=dsr or hybrid with
// --routing-mode=tunnel while the kube-proxy replacement is on (Cilium's
// rule: its tunnel DSR needs Geneve, cellium tunnels with VXLAN).
func CheckLBMode(p NodePortParams) error {
	if !p.SocketLB.KPR() || p.Routing.RoutingMode == "" {
		return nil
	}
	return p.LBMode.CheckRouting(p.Routing.RoutingMode)
}
