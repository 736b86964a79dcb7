package controlplane

import (
	"fmt"
	"net/netip"
	"strings"
	"sync"

	"github.com/cilium/hive/script"

	"github.com/cellium/cellium/datapath/hostsockets"
	"github.com/cellium/cellium/statedb/lb"
)

// HostSockets is the fake host's listening sockets, set by host/sockets:
// the socket load balancer's host-port check lists them
// (hostportcheck.Lister) and is told when they change
// (hostportcheck.Notifier).
type HostSockets struct {
	mu      sync.Mutex
	socks   []hostsockets.Socket
	procs   map[uint32]hostsockets.Process
	changed chan struct{}
}

func newHostSockets() *HostSockets { return &HostSockets{changed: make(chan struct{})} }

// Listening implements hostportcheck.Lister.
func (h *HostSockets) Listening() ([]hostsockets.Socket, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]hostsockets.Socket(nil), h.socks...), nil
}

// Processes implements hostportcheck.Lister.
func (h *HostSockets) Processes(inodes []uint32) map[uint32]hostsockets.Process {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[uint32]hostsockets.Process{}
	for _, i := range inodes {
		if p, ok := h.procs[i]; ok {
			out[i] = p
		}
	}
	return out
}

// Changed implements hostportcheck.Notifier.
func (h *HostSockets) Changed() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.changed
}

// set replaces the sockets by those of specs, "ADDR:PORT/PROTO@PROCESS";
// the process "agent" is the agent's own socket (its healthCheckNodePort
// server).
func (h *HostSockets) set(specs []string) error {
	var socks []hostsockets.Socket
	procs := map[uint32]hostsockets.Process{}
	for i, spec := range specs {
		addr, proc, ok := strings.Cut(spec, "@")
		if !ok {
			return fmt.Errorf("socket %q: want ADDR:PORT/PROTO@PROCESS", spec)
		}
		ap, protoName, ok := strings.Cut(addr, "/")
		if !ok {
			return fmt.Errorf("socket %q: want ADDR:PORT/PROTO@PROCESS", spec)
		}
		a, err := netip.ParseAddrPort(ap)
		if err != nil {
			return fmt.Errorf("socket %q: %w", spec, err)
		}
		proto := map[string]uint8{"TCP": lb.TCP, "UDP": lb.UDP}[protoName]
		if proto == 0 {
			return fmt.Errorf("socket %q: protocol TCP or UDP", spec)
		}
		inode := uint32(1000 + i)
		socks = append(socks, hostsockets.Socket{Proto: proto, Addr: a.Addr(), Port: a.Port(), Inode: inode, Own: proc == "agent"})
		procs[inode] = hostsockets.Process{PID: 100 + i, Comm: proc}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.socks, h.procs = socks, procs
	close(h.changed)
	h.changed = make(chan struct{})
	return nil
}

func (h *Harness) hostSocketsCmd() script.Cmd {
	return script.Command(script.CmdUsage{
		Summary: "Set the host's listening sockets the host-port check sees",
		Args:    "ADDR:PORT/PROTO@PROCESS...",
		Detail: []string{
			"Replaces every socket (none without arguments). PROCESS \"agent\" is",
			"a socket of the agent itself, such as its healthCheckNodePort server.",
		},
	}, func(s *script.State, args ...string) (script.WaitFunc, error) {
		return nil, h.Maps.Sockets.set(args)
	})
}
