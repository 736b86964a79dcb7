package plugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/cellium/cellium/api/v1/client"
	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/datapath/link"
)

// About is printed by the binary when it runs without CNI_COMMAND.
const About = "cellium-cni: the CNI plugin of cellium; it asks the cellium agent for the pod's address and endpoint"

// How long each command may take. ADD's budget covers the agent building
// the endpoint (sync-build-endpoint); kubelet's runtimes allow minutes for a
// sandbox. Rollback gets its own budget, so an ADD that ran out of time
// still undoes its work.
const (
	addTimeout      = 2 * time.Minute
	delTimeout      = time.Minute
	checkTimeout    = 30 * time.Second
	statusTimeout   = 10 * time.Second
	gcTimeout       = time.Minute
	rollbackTimeout = 30 * time.Second
)

// Plugin runs the CNI commands. Its methods have the signatures of
// skel.CNIFuncs; each returns nil or a *types.Error.
type Plugin struct {
	// Host is the network namespace of the host side of the veths. The
	// zero Host is the plugin's own namespace, the one the runtime runs it
	// in.
	Host link.Host

	// Stdout receives ADD's result.
	Stdout io.Writer

	// Stderr receives the log when the netconf names no log-file.
	Stderr io.Writer
}

// New returns a Plugin on the process's namespace, stdout and stderr.
func New() *Plugin {
	return &Plugin{Stdout: os.Stdout, Stderr: os.Stderr}
}

// Funcs returns the commands for skel.PluginMainFuncs.
func (p *Plugin) Funcs() skel.CNIFuncs {
	return skel.CNIFuncs{Add: p.Add, Del: p.Del, Check: p.Check, Status: p.Status, GC: p.GC}
}

// session is what every command starts with: its netconf, its logger and
// a client of the agent.
type session struct {
	conf     *NetConf
	log      *slog.Logger
	agent    *client.Client
	closeLog func()
}

func (p *Plugin) start(cmd string, args *skel.CmdArgs, prevResult bool) (*session, *types.Error) {
	conf, cerr := ParseNetConf(args.StdinData, prevResult)
	if cerr != nil {
		return nil, cerr
	}
	log, closeLog := p.logger(conf)
	log = log.With("cmd", cmd)
	if args.ContainerID != "" {
		log = log.With("containerID", args.ContainerID, "ifName", args.IfName, "netns", args.Netns)
	}
	log.Debug("start", "args", args.Args)
	return &session{conf: conf, log: log, agent: client.New(conf.socket()), closeLog: closeLog}, nil
}

// finish logs the outcome, releases the session and turns a nil
// *types.Error into a nil error.
func (s *session) finish(e *types.Error, started time.Time) error {
	defer s.closeLog()
	defer s.agent.Close()
	if e != nil {
		s.log.Error("failed", "code", e.Code, "msg", e.Msg, "details", e.Details, "duration", time.Since(started))
		return e
	}
	s.log.Info("done", "duration", time.Since(started))
	return nil
}

// logger returns the command's logger: to conf.LogFile at info level, or
// to Stderr at warning level; debug level with enable-debug.
func (p *Plugin) logger(conf *NetConf) (*slog.Logger, func()) {
	level := slog.LevelWarn
	var w io.Writer = p.Stderr
	closeLog := func() {}
	if conf.LogFile != "" {
		f, err := openLogFile(conf.LogFile)
		if err == nil {
			w, level, closeLog = f, slog.LevelInfo, func() { _ = f.Close() }
		} else if p.Stderr != nil {
			fmt.Fprintf(p.Stderr, "cellium-cni: cannot open log-file, logging to stderr: %v\n", err)
		}
	}
	if conf.EnableDebug {
		level = slog.LevelDebug
	}
	if w == nil {
		w = io.Discard
	}
	h := slog.NewTextHandler(w, &slog.HandlerOptions{Level: level})
	return slog.New(h).With("plugin", PluginType, "pid", os.Getpid()), closeLog
}

// openLogFile opens path for appending, creating it (0600). The plugin runs
// as root: it refuses a symlink (O_NOFOLLOW), so whoever can write the
// log's directory cannot make it append to another file, and anything but
// a regular file (O_NONBLOCK keeps a FIFO from blocking the open).
func openLogFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_CLOEXEC|syscall.O_NONBLOCK, 0o600)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			return nil, fmt.Errorf("log-file %s is a symbolic link: give the real path", path)
		}
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("log-file %s is not a regular file", path)
	}
	return f, nil
}

// Add is CNI ADD: allocate the pod's address (and learn the MTU) from the
// agent, create the veth pair, register the endpoint with the agent and
// wait until it is ready, print the result: two calls to the agent. Any
// failure undoes every step done so far.
func (p *Plugin) Add(args *skel.CmdArgs) error {
	started := time.Now()
	s, e := p.start("ADD", args, false)
	if e != nil {
		return e
	}
	return s.finish(p.add(s, args), started)
}

func (p *Plugin) add(s *session, args *skel.CmdArgs) *types.Error {
	if s.conf.RawPrevResult != nil {
		return newError(types.ErrInvalidNetworkConfig, "cellium-cni cannot be chained",
			"the configuration has a prevResult: cellium-cni must be the first plugin of its conflist")
	}
	k8s, e := ParseArgs(args.Args)
	if e != nil {
		return e
	}
	podNamespace, podName, e := k8s.pod()
	if e != nil {
		return e
	}
	if e := p.checkPodNetns(args.Netns, args.IfName); e != nil {
		return e
	}

	ctx, cancel := context.WithTimeout(context.Background(), addTimeout)
	defer cancel()

	// Two calls to the agent: the address (with the MTU), then the
	// endpoint.
	ipam, err := s.agent.AllocateIP(ctx, podNamespace+"/"+podName, args.ContainerID)
	if err != nil {
		return agentError("allocate an IP address for pod "+podNamespace+"/"+podName, err)
	}
	ipStr := ipam.IPv4.IP
	s.log.Debug("allocated", "ip", ipStr, "gateway", ipam.IPv4.Gateway, "mtu", ipam.MTU)

	// From here on, every failure undoes what this ADD did, and only that.
	var vethMade bool
	hostIfName := link.HostInterfaceName(args.ContainerID, args.IfName)
	fail := func(e *types.Error) *types.Error {
		rerr := p.rollback(s, args, hostIfName, ipStr, vethMade)
		if rerr != nil {
			s.log.Error("rollback incomplete", "error", rerr)
		} else {
			s.log.Debug("rolled back")
		}
		return withRollback(e, rerr)
	}

	mtu := s.conf.MTU
	if mtu == 0 {
		mtu = ipam.MTU
	}
	if mtu == 0 {
		// An agent older than the mtu of POST /v1/ipam's reply.
		cfg, err := s.agent.GetConfig(ctx)
		if err != nil {
			return fail(agentError("get the agent's configuration", err))
		}
		mtu = cfg.MTU
	}

	ip := net.ParseIP(ipStr).To4()
	gw := net.ParseIP(ipam.IPv4.Gateway).To4()
	if ip == nil || gw == nil {
		return fail(newError(types.ErrInternal, "agent returned an invalid address",
			fmt.Sprintf("POST /v1/ipam gave ip %q gateway %q; both must be IPv4 addresses", ipStr, ipam.IPv4.Gateway)))
	}

	res, err := p.Host.SetupEndpoint(ctx, link.Spec{
		ContainerID: args.ContainerID,
		NetnsPath:   args.Netns,
		IfName:      args.IfName,
		HostIfName:  hostIfName,
		MTU:         mtu,
		IPv4:        ip,
		Gateway:     gw,
	})
	if err != nil {
		// SetupEndpoint removed whatever it had made.
		return fail(linkError("create the pod interface", err))
	}
	vethMade = true
	s.log.Debug("interface created", "hostIfName", res.HostIfName, "hostIfIndex", res.HostIfIndex, "mtu", res.MTU)

	ep, err := s.agent.PutEndpoint(ctx, &models.EndpointChangeRequest{
		ContainerID:            args.ContainerID,
		ContainerInterfaceName: res.PodIfName,
		K8sNamespace:           podNamespace,
		K8sPodName:             podName,
		K8sUID:                 string(k8s.K8S_POD_UID),
		InterfaceName:          res.HostIfName,
		InterfaceIndex:         res.HostIfIndex,
		MAC:                    res.PodMAC.String(),
		HostMAC:                res.HostMAC.String(),
		NetnsPath:              args.Netns,
		Addressing:             models.AddressPair{IPV4: ip.String()},
		SyncBuildEndpoint:      true,
	})
	if err != nil {
		return fail(agentError("create the endpoint", err))
	}
	s.log.Info("endpoint ready", "endpointID", ep.ID, "ip", ipStr, "hostIfName", res.HostIfName,
		"pod", podNamespace+"/"+podName)

	if err := printResult(p.Stdout, newResult(res), s.conf.CNIVersion); err != nil {
		return fail(newError(types.ErrIOFailure, "cannot write the result", err.Error()))
	}
	return nil
}

// rollback undoes a failed ADD: the veth it made, then, at the agent, the
// endpoint only if it has this ADD's address (never an older endpoint of
// the same container ID) and the address only if this container still
// holds it. When the agent cannot be asked, the address stays allocated
// to the container: the runtime's DEL, which follows a failed ADD, frees
// it by container ID, and the agent's IPAM garbage collector frees it
// after --ipam-gc-grace if no DEL ever comes.
func (p *Plugin) rollback(s *session, args *skel.CmdArgs, hostIfName, ip string, vethMade bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), rollbackTimeout)
	defer cancel()
	var errs []error
	if vethMade {
		if err := p.Host.RemoveEndpoint(ctx, hostIfName, args.Netns); err != nil {
			errs = append(errs, fmt.Errorf("remove interface: %w", err))
		}
	}
	if _, err := s.agent.DeleteAttempt(ctx, args.ContainerID, ip); err != nil {
		errs = append(errs, fmt.Errorf("delete endpoint and release IP %s: %w", ip, err))
	}
	return errors.Join(errs...)
}

// checkPodNetns refuses a pod namespace that does not exist, is not a
// network namespace, is the node's own, or already has an interface
// named ifName (the CNI specification requires ADD to fail then).
func (p *Plugin) checkPodNetns(netnsPath, ifName string) *types.Error {
	podNS, err := ns.GetNS(netnsPath)
	if err != nil {
		return newError(types.ErrInvalidNetNS, "invalid CNI_NETNS",
			fmt.Sprintf("CNI_NETNS %q: %v", netnsPath, err))
	}
	defer podNS.Close()
	hostPath := p.Host.NetnsPath
	if hostPath == "" {
		hostPath = "/proc/self/ns/net"
	}
	hostNS, err := ns.GetNS(hostPath)
	if err != nil {
		return newError(types.ErrInternal, "cannot open the node's network namespace", err.Error())
	}
	defer hostNS.Close()
	if sameNetns(podNS, hostNS) {
		return newError(types.ErrInvalidNetNS, "invalid CNI_NETNS",
			fmt.Sprintf("CNI_NETNS %q is the node's network namespace; a pod needs its own", netnsPath))
	}
	var exists bool
	err = podNS.Do(func(ns.NetNS) error {
		_, err := netlink.LinkByName(ifName)
		var nf netlink.LinkNotFoundError
		switch {
		case err == nil:
			exists = true
		case errors.As(err, &nf), errors.Is(err, syscall.ENODEV):
		default:
			return err
		}
		return nil
	})
	if err != nil {
		return newError(types.ErrInternal, "cannot list the pod's interfaces", fmt.Sprintf("CNI_NETNS %q: %v", netnsPath, err))
	}
	if exists {
		return newError(ErrCodeInterfaceExists, "interface already exists",
			fmt.Sprintf("the pod's network namespace %s already has an interface %s; run DEL for this container first", netnsPath, ifName))
	}
	return nil
}

func sameNetns(a, b ns.NetNS) bool {
	var sa, sb syscall.Stat_t
	if syscall.Fstat(int(a.Fd()), &sa) != nil || syscall.Fstat(int(b.Fd()), &sb) != nil {
		return false
	}
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino
}

// Del is CNI DEL: delete the container's endpoint at the agent (which
// releases its address) and remove the veth. Everything already gone is
// fine, including the network namespace. When the agent cannot be asked,
// the veth is still removed and DEL fails with ErrTryAgainLater, so the
// runtime calls it again and the address is not leaked.
func (p *Plugin) Del(args *skel.CmdArgs) error {
	started := time.Now()
	s, e := p.start("DEL", args, false)
	if e != nil {
		return e
	}
	return s.finish(p.del(s, args), started)
}

func (p *Plugin) del(s *session, args *skel.CmdArgs) *types.Error {
	ctx, cancel := context.WithTimeout(context.Background(), delTimeout)
	defer cancel()
	hostIfName := link.HostInterfaceName(args.ContainerID, args.IfName)

	found, agentErr := s.agent.DeleteEndpointByContainerID(ctx, args.ContainerID)
	if agentErr == nil {
		s.log.Debug("endpoint deleted", "found", found)
	}

	linkErr := p.Host.RemoveEndpoint(ctx, hostIfName, args.Netns)
	if errors.Is(linkErr, link.ErrHostLinkInUse) {
		// Not ours: leave it alone.
		s.log.Warn("host link is not a cellium veth; left alone", "hostIfName", hostIfName, "error", linkErr)
		linkErr = nil
	}

	if agentErr != nil {
		if isTransient(agentErr) {
			e := agentError("delete the endpoint", agentErr)
			if linkErr != nil {
				e = newError(e.Code, e.Msg, fmt.Sprintf("%s; also: %v", e.Details, linkErr))
			}
			return e
		}
		// The agent refused the request (not a 404): asking again
		// would get the same answer.
		s.log.Warn("agent refused to delete the endpoint; not retried", "error", agentErr)
	}
	if linkErr != nil {
		return linkError("remove the pod interface", linkErr)
	}
	return nil
}

// Check is CNI CHECK: the agent knows the container's endpoint with the
// address of prevResult and it is usable, and the veth, address and routes
// are in place.
func (p *Plugin) Check(args *skel.CmdArgs) error {
	started := time.Now()
	s, e := p.start("CHECK", args, true)
	if e != nil {
		return e
	}
	return s.finish(p.check(s, args), started)
}

func (p *Plugin) check(s *session, args *skel.CmdArgs) *types.Error {
	if s.conf.PrevResult == nil {
		return newError(types.ErrInvalidNetworkConfig, "CHECK needs prevResult",
			"the runtime must pass the result of the ADD as prevResult")
	}
	att, err := findAttachment(s.conf.PrevResult, args.IfName, args.Netns)
	if err != nil {
		return newError(types.ErrInvalidNetworkConfig, "invalid prevResult", err.Error())
	}
	ctx, cancel := context.WithTimeout(context.Background(), checkTimeout)
	defer cancel()

	eps, err := s.agent.GetEndpoints(ctx)
	if err != nil {
		return agentError("list endpoints", err)
	}
	ep := findEndpoint(eps, args.ContainerID)
	if ep == nil {
		return newError(ErrCodeEndpointNotFound, "the agent has no endpoint for the container",
			fmt.Sprintf("no endpoint with container ID %s; the pod's sandbox must be recreated", args.ContainerID))
	}
	switch ep.Status.State {
	case models.EndpointStateInvalid, models.EndpointStateDisconnecting, models.EndpointStateDisconnected:
		return newError(ErrCodeEndpointMismatch, "the container's endpoint is not usable",
			fmt.Sprintf("endpoint %d is %s", ep.ID, ep.Status.State))
	}
	if epIP := endpointIPv4(ep); epIP != "" && epIP != att.ip.String() {
		return newError(ErrCodeEndpointMismatch, "the container's endpoint has another address",
			fmt.Sprintf("endpoint %d has %s, prevResult %s", ep.ID, epIP, att.ip))
	}

	mtu := att.mtu
	if mtu == 0 {
		mtu = s.conf.MTU
	}
	if mtu == 0 {
		cfg, err := s.agent.GetConfig(ctx)
		if err != nil {
			return agentError("get the agent's configuration", err)
		}
		mtu = cfg.MTU
	}
	err = p.Host.CheckEndpoint(ctx, link.Spec{
		ContainerID: args.ContainerID,
		NetnsPath:   args.Netns,
		IfName:      args.IfName,
		HostIfName:  link.HostInterfaceName(args.ContainerID, args.IfName),
		MTU:         mtu,
		MAC:         att.podMAC,
		IPv4:        att.ip,
		Gateway:     att.gateway,
	})
	return linkError("check the pod interface", err)
}

// findEndpoint returns the endpoint of containerID, or nil.
func findEndpoint(eps []models.Endpoint, containerID string) *models.Endpoint {
	for i := range eps {
		if endpointContainerID(&eps[i]) == containerID {
			return &eps[i]
		}
	}
	return nil
}

func endpointContainerID(ep *models.Endpoint) string {
	if ep.Spec != nil && ep.Spec.ContainerID != "" {
		return ep.Spec.ContainerID
	}
	if ep.Status.ExternalIdentifiers != nil {
		return ep.Status.ExternalIdentifiers.ContainerID
	}
	return ""
}

func endpointIPv4(ep *models.Endpoint) string {
	if ep.Status.Networking != nil {
		for _, a := range ep.Status.Networking.Addressing {
			if a != nil && a.IPV4 != "" {
				return a.IPV4
			}
		}
	}
	if ep.Spec != nil {
		return ep.Spec.Addressing.IPV4
	}
	return ""
}

// Status is CNI STATUS: the agent answers GET /v1/healthz. A reachable
// agent with degraded modules can still serve ADD, so it is not an error
// (a failing STATUS makes the node NotReady); it is logged.
func (p *Plugin) Status(args *skel.CmdArgs) error {
	started := time.Now()
	s, e := p.start("STATUS", args, false)
	if e != nil {
		return e
	}
	return s.finish(p.status(s), started)
}

func (p *Plugin) status(s *session) *types.Error {
	ctx, cancel := context.WithTimeout(context.Background(), statusTimeout)
	defer cancel()
	h, err := s.agent.GetHealthz(ctx)
	if err != nil {
		return newError(types.ErrPluginNotAvailable, "cellium agent not available", err.Error())
	}
	if h.State != models.HealthStateOK {
		var degraded []string
		for _, m := range h.Modules {
			if m.Level != "ok" && m.Level != "stopped" {
				degraded = append(degraded, m.Module)
			}
		}
		s.log.Warn("agent reports degraded modules", "state", h.State, "modules", strings.Join(degraded, ","))
	}
	return nil
}

// GC is CNI GC: remove the endpoints and the veths of attachments that
// are not in cni.dev/valid-attachments. Only what cellium's ADD made is
// touched: endpoints the agent created for CNI attachments (they have a
// container ID and a pod) and host links labelled by datapath/link with a
// container ID. Links of the agent's own endpoints (those without a pod,
// like the health endpoint) are kept. Without the agent's endpoint list
// GC does nothing and reports ErrTryAgainLater.
func (p *Plugin) GC(args *skel.CmdArgs) error {
	started := time.Now()
	s, e := p.start("GC", args, false)
	if e != nil {
		return e
	}
	return s.finish(p.gc(s), started)
}

func (p *Plugin) gc(s *session) *types.Error {
	ctx, cancel := context.WithTimeout(context.Background(), gcTimeout)
	defer cancel()
	eps, err := s.agent.GetEndpoints(ctx)
	if err != nil {
		return agentError("list endpoints", err)
	}
	links, err := p.Host.ListHostInterfaces()
	if err != nil {
		return linkError("list host interfaces", err)
	}
	plan := planGC(s.conf.ValidAttachments, eps, links)
	var errs []error
	for _, cid := range plan.endpoints {
		if _, err := s.agent.DeleteEndpointByContainerID(ctx, cid); err != nil {
			errs = append(errs, fmt.Errorf("delete endpoint of container %s: %w", cid, err))
			continue
		}
		s.log.Info("deleted stale endpoint", "staleContainerID", cid)
	}
	for _, name := range plan.links {
		if err := p.Host.RemoveEndpoint(ctx, name, ""); err != nil {
			errs = append(errs, err)
			continue
		}
		s.log.Info("removed stale interface", "hostIfName", name)
	}
	if len(errs) > 0 {
		err := errors.Join(errs...)
		if isTransient(err) {
			return agentError("garbage collection", err)
		}
		return newError(types.ErrInternal, "garbage collection incomplete", err.Error())
	}
	return nil
}

// gcPlan is what GC removes.
type gcPlan struct {
	// endpoints are the container IDs of stale endpoints.
	endpoints []string
	// links are the names of stale host links.
	links []string
}

type attachmentKey struct{ containerID, ifName string }

// planGC decides what GC removes: endpoints made for CNI attachments of
// containers with no valid attachment, and veths labelled with an
// attachment that is not valid and a container that is not one of the
// agent's own endpoints.
func planGC(valid []types.GCAttachment, eps []models.Endpoint, links []link.HostLink) gcPlan {
	validSet := make(map[attachmentKey]bool, len(valid))
	validContainer := make(map[string]bool, len(valid))
	for _, a := range valid {
		validSet[attachmentKey{a.ContainerID, a.IfName}] = true
		validContainer[a.ContainerID] = true
	}
	keep := map[string]bool{} // container IDs of the agent's own endpoints
	var plan gcPlan
	seen := map[string]bool{}
	for i := range eps {
		ep := &eps[i]
		spec := ep.Spec
		if spec == nil || spec.ContainerID == "" || spec.K8sNamespace == "" || spec.K8sPodName == "" {
			// Not made by ADD, or not enough known to tell: keep it
			// and its interface.
			if cid := endpointContainerID(ep); cid != "" {
				keep[cid] = true
			}
			continue
		}
		// Endpoints are deleted by container ID: a container with any
		// valid attachment keeps its endpoint.
		if validContainer[spec.ContainerID] || seen[spec.ContainerID] {
			continue
		}
		seen[spec.ContainerID] = true
		plan.endpoints = append(plan.endpoints, spec.ContainerID)
	}
	for _, l := range links {
		if l.ContainerID == "" || l.Kind != "veth" {
			continue // not made by datapath/link: not cellium's
		}
		if validSet[attachmentKey{l.ContainerID, l.IfName}] || keep[l.ContainerID] {
			continue
		}
		plan.links = append(plan.links, l.Name)
	}
	return plan
}
