// Package cniconfig is the agent cell that owns the CNI side of the node:
// the pod MTU, the agent configuration the CNI plugin reads
// (GET /v1/config), and the conflist the agent writes once it can serve
// pods, so that the container runtime starts calling cellium-cni only then.
package cniconfig

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/cilium/statedb"
	"github.com/spf13/pflag"

	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/cells/agentapi"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/ipam"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/cells/statedir"
	"github.com/cellium/cellium/statedb/endpoints"
	ipamtables "github.com/cellium/cellium/statedb/ipam"
	"github.com/cellium/cellium/statedb/nodes"
	"github.com/cellium/cellium/statedb/routes"
	"github.com/cellium/cellium/statedb/tables"
)

// Cell serves GET /v1/config and writes the conflist when ready.
var Cell = hive.Module("cni-config", "CNI configuration",
	hive.Config(DefaultConfig),
	// GET /v1/config: MTU, node name, every flag.
	hive.Provide(configHandler),
	// The pod MTU for POST /v1/ipam's reply (ipam.PodMTU).
	hive.Provide(newAutoMTU, podMTU),
	// Writes the conflist once endpoints are restored and the local node
	// has a router IP (IPAM has a pod CIDR).
	hive.Invoke(registerWriter),
)

// DefaultConfListPath is where the conflist is written by default.
const DefaultConfListPath = "/etc/cni/net.d/05-cellium.conflist"

// Chaining modes of --cni-chaining-mode (Cilium's names).
const (
	// ChainingNone: the conflist holds cellium-cni alone.
	ChainingNone = "none"
	// ChainingPortmap: cellium-cni followed by the portmap plugin of
	// containernetworking/plugins, which implements the pods' hostPort.
	ChainingPortmap = "portmap"
)

// ChainingModes are the supported values of --cni-chaining-mode.
var ChainingModes = []string{ChainingNone, ChainingPortmap}

// Config is the cell's configuration.
type Config struct {
	// MTU of pod interfaces.
	MTU int
	// WriteCNIConfWhenReady is the conflist path; empty disables writing.
	WriteCNIConfWhenReady string
	// CNIChainingMode selects the conflist: ChainingNone or ChainingPortmap.
	CNIChainingMode string
}

// DefaultConfig writes DefaultConfListPath with the automatic MTU and no
// chaining.
var DefaultConfig = Config{MTU: 0, WriteCNIConfWhenReady: DefaultConfListPath, CNIChainingMode: ChainingNone}

// DefaultMTU is the pod MTU of --mtu=0 without a tunnel device.
const DefaultMTU = 1500

// Flags registers --mtu, --write-cni-conf-when-ready and --cni-chaining-mode.
func (def Config) Flags(fs *pflag.FlagSet) {
	fs.Int("mtu", def.MTU, "MTU of pod interfaces; 0: automatic (the tunnel device's MTU, the uplink's minus 50, in tunnel routing mode; 1500 otherwise)")
	fs.String("write-cni-conf-when-ready", def.WriteCNIConfWhenReady, `Write the CNI conflist to this path once the agent can serve pods ("" to disable)`)
	fs.String("cni-chaining-mode", def.CNIChainingMode,
		`CNI plugins chained after cellium-cni in the written conflist: "none", or "portmap" (the portmap plugin, which implements hostPort)`)
}

// Validate checks the MTU range and the chaining mode.
func (c Config) Validate() error {
	if c.MTU != 0 && (c.MTU < 576 || c.MTU > 65535) {
		return fmt.Errorf("invalid --mtu=%d: must be 0 (automatic) or between 576 and 65535", c.MTU)
	}
	if !slices.Contains(ChainingModes, c.CNIChainingMode) {
		return fmt.Errorf("invalid --cni-chaining-mode=%q: supported modes are %s", c.CNIChainingMode, strings.Join(ChainingModes, ", "))
	}
	return nil
}

// PodMTU returns --mtu when it is set (not 0).
func (c Config) PodMTU() int { return c.MTU }

// AutoMTU is the pod MTU: --mtu when set, else the MTU of the tunnel
// device the host-routing cell desires (statedb/routes: the uplink's MTU
// minus the VXLAN overhead, in tunnel routing mode), else DefaultMTU.
type AutoMTU struct {
	Config Config
	DB     *statedb.DB
	// Devices is nil without the host-routing cell.
	Devices statedb.Table[*routes.Device]
}

// PodMTU implements ipam.PodMTU.
func (a AutoMTU) PodMTU() int {
	if a.Config.MTU != 0 {
		return a.Config.MTU
	}
	if a.Devices != nil && a.DB != nil {
		if d, _, found := a.Devices.Get(a.DB.ReadTxn(), routes.DeviceNameIndex.Query(routes.TunnelDevice)); found && d.MTU > 0 {
			return d.MTU
		}
	}
	return DefaultMTU
}

type mtuParams struct {
	hive.In
	Config  Config
	DB      *statedb.DB
	Devices statedb.Table[*routes.Device] `optional:"true"`
}

func newAutoMTU(p mtuParams) AutoMTU { return AutoMTU{Config: p.Config, DB: p.DB, Devices: p.Devices} }

func podMTU(a AutoMTU) ipam.PodMTU { return a }

func configHandler(mtu AutoMTU, node k8s.NodeName, flags hive.FlagValues) agentapi.HandlersOut {
	return agentapi.HandlersOut{Handlers: []agentapi.Handler{{
		Pattern: "GET /config",
		Handler: func(w http.ResponseWriter, r *http.Request) {
			agentapi.WriteJSON(w, r, models.DaemonConfig{MTU: mtu.PodMTU(), NodeName: string(node), Options: flags.All()})
		},
	}}}
}

// ConfList is the conflist the agent writes for a chaining mode: network
// "cellium" with cellium-cni alone (ChainingNone), or, as Cilium writes it,
// network "portmap" with cellium-cni followed by
// {"type":"portmap","capabilities":{"portMappings":true}}: the runtime
// passes the pod's hostPorts to portmap (runtimeConfig.portMappings), and
// portmap finds the pod's address in cellium-cni's result (prevResult).
//
// Errors: an unsupported mode.
func ConfList(socket string, mtu int, mode string) ([]byte, error) {
	cellium := map[string]any{
		"type":         "cellium-cni",
		"agent-socket": socket,
		"mtu":          mtu,
	}
	list := map[string]any{"cniVersion": "1.1.0"}
	switch mode {
	case ChainingNone:
		list["name"] = "cellium"
		list["plugins"] = []map[string]any{cellium}
	case ChainingPortmap:
		list["name"] = "portmap"
		list["plugins"] = []map[string]any{cellium, {
			"type":         "portmap",
			"capabilities": map[string]bool{"portMappings": true},
		}}
	default:
		return nil, fmt.Errorf("CNI configuration: unsupported chaining mode %q (supported: %s)", mode, strings.Join(ChainingModes, ", "))
	}
	return json.MarshalIndent(list, "", "  ")
}

type writerParams struct {
	hive.In
	Config    Config
	API       agentapi.Config
	DB        *statedb.DB
	Node      k8s.NodeName
	Endpoints statedb.Table[*endpoints.Endpoint]
	LocalNode statedb.Table[*nodes.LocalNode]
	MTU       AutoMTU
	// Devices, when present (host routing on), must be initialized (the
	// tunnel device's MTU known) before the conflist is written.
	Devices statedb.Table[*routes.Device] `optional:"true"`
	// IPAM, when present, says when the node can hand out addresses: from
	// its CiliumNode or, with the API server down after a reboot, from the
	// CIDRs of its state file. Without it the router IP on the local-node
	// row (known only once the Node object is seen) stands for that.
	IPAM statedb.Table[*ipamtables.Allocation] `optional:"true"`
	Jobs hive.Jobs
	Log  *slog.Logger
}

func registerWriter(p writerParams) {
	if p.Config.WriteCNIConfWhenReady == "" {
		return
	}
	p.Jobs.Add(hive.OneShot("write-cni-conf", func(ctx context.Context, h hive.Health) error {
		h.OK("waiting for endpoint restore and a pod CIDR")
		if err := tables.WaitInitialized(ctx, p.DB, p.Endpoints); err != nil {
			return nil // stopped
		}
		if err := waitPodCIDR(ctx, p); err != nil {
			return nil // stopped
		}
		if p.Devices != nil {
			if err := tables.WaitInitialized(ctx, p.DB, p.Devices); err != nil {
				return nil // stopped
			}
		}
		data, err := ConfList(p.API.SocketPath, p.MTU.PodMTU(), p.Config.CNIChainingMode)
		if err != nil {
			return err
		}
		if err := writeAtomic(p.Config.WriteCNIConfWhenReady, data); err != nil {
			return err
		}
		p.Log.Info("wrote CNI configuration", "path", p.Config.WriteCNIConfWhenReady, "chaining-mode", p.Config.CNIChainingMode)
		return nil
	}, hive.WithRetry(-1, time.Second, 30*time.Second)))
}

// waitPodCIDR waits until IPAM can allocate (its allocations table is
// initialized once the pool is built), or for the local node's router IP.
func waitPodCIDR(ctx context.Context, p writerParams) error {
	if p.IPAM != nil {
		return tables.WaitInitialized(ctx, p.DB, p.IPAM)
	}
	return waitRouterIP(ctx, p.DB, p.LocalNode, p.Node)
}

// waitRouterIP waits until the local-node row has a router IP: IPAM has a
// pod CIDR, so ADDs can be served. It wakes on the row's watch channel.
func waitRouterIP(ctx context.Context, db *statedb.DB, local statedb.Table[*nodes.LocalNode], name k8s.NodeName) error {
	for {
		n, _, watch, found := local.GetWatch(db.ReadTxn(), nodes.LocalNodeNameIndex.Query(string(name)))
		if found && n.RouterIP.IsValid() {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-watch:
		}
	}
}

func writeAtomic(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("write CNI configuration: %w", err)
	}
	if err := statedir.WriteFile(path, data, 0o644); err != nil {
		return fmt.Errorf("write CNI configuration: %w", err)
	}
	return nil
}
