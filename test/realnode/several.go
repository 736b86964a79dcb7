package realnode

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/test/devkubelet/devnode"
	"github.com/cellium/cellium/test/harness"
)

// NodeNamespaceName is the name of the network namespace of node i of a
// several-node cluster (ip netns; its uplink on the bridge is the name
// with "h").
func NodeNamespaceName(i int) string { return "crnode" + strconv.Itoa(i) }

// ClusterValues are the chart values (helm --set) that install cellium on
// a cluster whose nodes run in namespaces of their own, whose API server
// listens on apiHost:apiPort (the bridge's address): the chart's default
// host paths (one DaemonSet for every node; each node's paths are its own
// folders), the locally packed images (cellium's, and hubble-relay's when
// enabled), no masquerading, portmap chained, one operator replica with its
// health port free. The agent's
// --cgroup-root is the chart's default, where each node has its own cgroup
// v2 subtree mounted ([Node] with Options.Namespaces).
func ClusterValues(apiHost string, apiPort, operatorPort int, podCIDR string) []string {
	return []string{
		"image.repository=cellium.local/cellium",
		"image.tag=dev",
		"image.pullPolicy=Never",
		"k8sServiceHost=" + apiHost,
		"k8sServicePort=" + strconv.Itoa(apiPort),
		"agent.ipv4Masquerade=false",
		"cni.chainingMode=portmap",
		"operator.replicas=1",
		"operator.apiServeAddr=localhost:" + strconv.Itoa(operatorPort),
		"operator.clusterPool.ipv4CIDR={" + podCIDR + "}",
		"operator.clusterPool.ipv4MaskSize=24",
		"hubble.relay.image.repository=" + imageRepository(HubbleRelayImage),
		"hubble.relay.image.tag=" + imageTag(HubbleRelayImage),
		"hubble.relay.image.pullPolicy=Never",
	}
}

// upSeveral is Up for several nodes: with the machine's host-network lock
// held, the pods' and Services' ranges blackholed, the nodes' bridge, the
// API server on the bridge's address, every node in namespaces of its own
// (kube-scheduler on the host with the first), cellium from the chart with
// its default paths, a host route to each node's pod CIDR, CoreDNS.
func (c *Cluster) upSeveral(ctx context.Context) error {
	opts, log := c.opts, c.log
	began := time.Now()
	// The bridge's addresses, the pod CIDR's routes and the blackholes are
	// the machine's: one such cluster (or one-node cluster) at a time.
	unlock, err := harness.LockHostNetwork(ctx, func() {
		log.Info("waiting for another node or host-routing test on this machine to finish")
	})
	if err != nil {
		return fmt.Errorf("real cluster: %w", err)
	}
	c.unlock = unlock
	for _, p := range []string{opts.PodCIDR, opts.ServiceCIDR} {
		prefix, err := netip.ParsePrefix(p)
		if err != nil {
			return err
		}
		added, err := addBlackhole(prefix)
		if err != nil {
			return err
		}
		if added {
			c.state.Blackholes = append(c.state.Blackholes, p)
			if err := c.writeState(); err != nil {
				return err
			}
		}
	}
	if _, err := netlink.LinkByName(NodesBridge); err == nil {
		return fmt.Errorf("the nodes' bridge %s exists already (another several-node cluster? make down stops it, or ip link delete %s)", NodesBridge, NodesBridge)
	}
	// Recorded first: Down removes it whatever happens next.
	c.state.Bridge = NodesBridge
	if err := c.writeState(); err != nil {
		return err
	}
	if _, err := EnsureBridge(NodesBridge); err != nil {
		return err
	}
	dnsIP, err := DNSServiceIP(opts.ServiceCIDR)
	if err != nil {
		return err
	}
	// In kvstore mode the agents and the operator, in the nodes'
	// namespaces, reach etcd where they reach the API server.
	var etcdAddr netip.Addr
	if opts.KVStore {
		etcdAddr = BridgeAddr
	}
	c.Control, err = harness.Start(ctx, harness.Options{
		Dir:                   c.Dir,
		Detach:                opts.Detach,
		ControllerManager:     true,
		NodeAuthorizer:        true,
		APIServerArgs:         []string{"--kubelet-preferred-address-types=InternalIP"},
		ServiceClusterIPRange: opts.ServiceCIDR,
		BindAddress:           BridgeAddr,
		EtcdAddress:           etcdAddr,
		StartTimeout:          opts.StartTimeout,
		Logger:                log,
	})
	if err != nil {
		return err
	}
	c.state.Kubeconfig = c.Control.Kubeconfig()
	if err := c.writeState(); err != nil {
		return err
	}
	images, err := opts.packImages(ctx, filepath.Join(c.Dir, "images"), log)
	if err != nil {
		return err
	}
	dnsImage, dnsImageName, err := CoreDNSImage(filepath.Join(c.Dir, "images"), opts.NodeBinaries)
	if err != nil {
		return err
	}
	images = append(images, dnsImage)
	for i := 1; i <= opts.Nodes; i++ {
		ip, err := NodeIPAt(i)
		if err != nil {
			return err
		}
		nodeDir := filepath.Join(c.Dir, "node"+strconv.Itoa(i))
		if i == 1 {
			c.state.NodeDir = nodeDir
		}
		c.state.NodeDirs = append(c.state.NodeDirs, nodeDir)
		if err := c.writeState(); err != nil {
			return err
		}
		n, err := Start(ctx, Options{
			Namespaces:   &NodeNamespaces{Name: NodeNamespaceName(i), Dir: nodeDir, IP: ip},
			Bridge:       NodesBridge,
			ClusterDNS:   dnsIP.String(),
			Cluster:      c.Control,
			Binaries:     opts.NodeBinaries,
			Dir:          nodeDir,
			Images:       images,
			Scheduler:    i == 1,
			KubeProxy:    !opts.KubeProxyReplacement,
			ClusterCIDR:  opts.PodCIDR,
			StartTimeout: opts.StartTimeout,
			Detach:       opts.Detach,
			Logger:       log,
		})
		if err != nil {
			return err
		}
		c.Nodes = append(c.Nodes, n)
		if i == 1 {
			c.Node = n
		}
	}
	if err := Install(ctx, c.Control, c.Node, InstallOptions{PodCIDR: opts.PodCIDR, Values: c.installValues(), DefaultPaths: true, HubbleRelay: opts.HubbleRelay, Logger: log}); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 2*opts.StartTimeout)
	defer cancel()
	if err := WaitInstalled(wctx, c.Control.Clientset()); err != nil {
		return err
	}
	for _, n := range c.Nodes {
		if err := n.WaitReady(ctx); err != nil {
			return err
		}
	}
	// Replies of the API server (on the host) to pods go back through the
	// node of the pod's CIDR.
	if err := c.routePodCIDRs(wctx); err != nil {
		return err
	}
	log.Info("deploying CoreDNS", "image", dnsImageName, "service", DNSService, "clusterIP", dnsIP)
	if err := DeployCoreDNS(ctx, c.Control, dnsImageName, dnsIP); err != nil {
		return err
	}
	dctx, dcancel := context.WithTimeout(ctx, opts.StartTimeout)
	defer dcancel()
	if err := WaitCoreDNS(dctx, c.Control.Clientset()); err != nil {
		return fmt.Errorf("CoreDNS: %w", err)
	}
	c.DNSServiceIP = dnsIP
	if err := c.waitRelay(ctx); err != nil {
		return err
	}
	names := make([]string, 0, len(c.Nodes))
	for _, n := range c.Nodes {
		names = append(names, n.Name)
	}
	log.Info("real cluster ready", "kubeconfig", c.Kubeconfig(), "nodes", names, "took", time.Since(began).Round(time.Millisecond))
	return nil
}

// routePodCIDRs waits until each node's CiliumNode has its pod CIDRs from
// the operator and routes each in the host's namespace via the node's
// address (more specific than the pod CIDR's blackhole).
func (c *Cluster) routePodCIDRs(ctx context.Context) error {
	cs := c.Control.Clientset()
	for _, n := range c.Nodes {
		var cidrs []string
		err := devnode.WaitFor(ctx, nil, func() error {
			var cn ciliumv2.CiliumNode
			if err := cs.CoreV1().RESTClient().Get().AbsPath("/apis/cilium.io/v2/ciliumnodes", n.Name).Do(ctx).Into(&cn); err != nil {
				return fmt.Errorf("CiliumNode %s: %w", n.Name, err)
			}
			if len(cn.Spec.IPAM.PodCIDRs) == 0 {
				return fmt.Errorf("CiliumNode %s has no pod CIDR yet", n.Name)
			}
			cidrs = cn.Spec.IPAM.PodCIDRs
			return nil
		})
		if err != nil {
			return err
		}
		for _, cidr := range cidrs {
			p, err := netip.ParsePrefix(cidr)
			if err != nil || !p.Addr().Is4() {
				continue // IPv4 only here
			}
			r := podCIDRRoute{CIDR: p.String(), Via: n.IP.String()}
			c.state.Routes = append(c.state.Routes, r)
			if err := c.writeState(); err != nil {
				return err
			}
			if err := netlink.RouteReplace(r.route()); err != nil {
				return fmt.Errorf("route %s via %s: %w", r.CIDR, r.Via, err)
			}
			c.log.Info("routing a node's pod CIDR", "cidr", r.CIDR, "via", r.Via)
		}
	}
	return nil
}

func (r podCIDRRoute) route() *netlink.Route {
	_, dst, _ := net.ParseCIDR(r.CIDR)
	return &netlink.Route{Dst: dst, Gw: net.ParseIP(r.Via), Protocol: unix.RTPROT_STATIC}
}

// removePodCIDRRoutes removes the routes routePodCIDRs added; missing
// ones are no error.
func removePodCIDRRoutes(routes []podCIDRRoute) error {
	var errs []error
	for _, r := range routes {
		rt := r.route()
		if rt.Dst == nil {
			continue
		}
		if err := netlink.RouteDel(rt); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("remove route %s via %s: %w", r.CIDR, r.Via, err))
		}
	}
	return errors.Join(errs...)
}

// removeBridge deletes the nodes' bridge if Up made it ("" : none).
func removeBridge(name string) error {
	if name == "" {
		return nil
	}
	return deleteLink(name)
}
