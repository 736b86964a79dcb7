package plugin

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/cells/cniconfig"
	"github.com/cellium/cellium/test/harness"
)

// The addresses of TestPrivilegedPortmapChained, all inside namespaces the
// test makes: the node's side of the client's link and the client.
const (
	portmapNodeAddr   = "10.211.0.1"
	portmapClientAddr = "10.211.0.2"
	portmapPodPort    = 8080
	// portmapAnyPort maps on every node address, portmapLocalPort only on
	// 127.0.0.1 (a hostIP).
	portmapAnyPort   = 31080
	portmapLocalPort = 31081
	portmapReply     = "hello from the pod\n"
)

// TestPrivilegedPortmapChained runs the conflist the agent writes with
// --cni-chaining-mode=portmap (cellium-cni, then portmap v1.10.0 as the
// image carries it) through libcni in a node namespace the test makes,
// with a pod's hostPort mappings as kubelet passes them (runtimeConfig
// portMappings):
//
//   - portmap finds the pod's address in cellium-cni's result (prevResult)
//     and passes that result on: the list's result is cellium-cni's;
//   - a TCP server in the pod is reachable at node:hostPort from another
//     namespace (not a cellium endpoint) and from the node itself, and at
//     127.0.0.1:hostPort for a mapping with hostIP 127.0.0.1, which no
//     other node address serves;
//   - CHECK reaches portmap with the cached result: it passes for the
//     pod's mappings and fails for mappings that were never made;
//   - DEL removes portmap's rules (and everything cellium-cni made);
//   - STATUS and GC of the list succeed (portmap v1.10.0 implements
//     neither).
//
// Everything (the veths, the routes, portmap's iptables or nftables rules)
// lives in the test's namespaces and goes with them.
func TestPrivilegedPortmapChained(t *testing.T) {
	e := privilegedEnv(t)
	dump := ruleDumper(t, e)
	pluginDir, err := harness.EnsureImageCNIPlugins(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	e.paths = append(e.paths, pluginDir)
	e.cni = libcni.NewCNIConfigWithCacheDir(e.paths, filepath.Join(e.dir, "cache"), newExec())
	data, err := cniconfig.ConfList(e.socket, fakeMTU, cniconfig.ChainingPortmap)
	if err != nil {
		t.Fatal(err)
	}
	list, err := libcni.ConfListFromBytes(data)
	if err != nil {
		t.Fatalf("load the agent's conflist: %v\n%s", err, data)
	}
	// STATUS (CNI 1.1.0) goes to every plugin of the list; the runtime
	// reports the node's network not ready if one fails.
	if err := e.status(list); err != nil {
		t.Fatalf("STATUS of the chained list: %v", err)
	}
	pod := newTestNS(t)
	client := newTestNS(t)
	setupPortmapNode(t, e, client)
	// The agent routes to the endpoint before it answers the PUT: portmap
	// looks that route up during ADD (route_localnet for 127.0.0.1).
	e.agent.set(func(a *fakeAgent) {
		a.onPut = func(req models.EndpointChangeRequest) error {
			return e.inNode(func() error {
				l, err := netlink.LinkByName(req.InterfaceName)
				if err != nil {
					return err
				}
				_, dst, err := net.ParseCIDR(req.Addressing.IPV4 + "/32")
				if err != nil {
					return err
				}
				return netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: dst, Scope: netlink.SCOPE_LINK})
			})
		}
	})
	serve(t, pod)

	rt := podRuntime("ctr-portmap", pod.Path(), "web")
	rt.CapabilityArgs = map[string]any{"portMappings": []map[string]any{
		{"hostPort": portmapAnyPort, "containerPort": portmapPodPort, "protocol": "tcp"},
		{"hostPort": portmapLocalPort, "containerPort": portmapPodPort, "protocol": "tcp", "hostIP": "127.0.0.1"},
	}}
	res, err := e.add(list, rt)
	if err != nil {
		t.Fatalf("ADD: %v", err)
	}
	cur, err := types100.NewResultFromResult(res)
	if err != nil {
		t.Fatal(err)
	}
	ep := e.agent.endpoint("ctr-portmap")
	if ep == nil || len(cur.IPs) != 1 || cur.IPs[0].Address.IP.String() != ep.Spec.Addressing.IPV4 ||
		len(cur.Interfaces) != 2 || cur.Interfaces[0].Name != ep.Spec.InterfaceName || cur.Interfaces[1].Sandbox != pod.Path() {
		t.Fatalf("the list's result %+v is not cellium-cni's for endpoint %+v", cur, ep)
	}
	if rules := dump(); !strings.Contains(rules, fmt.Sprint(portmapAnyPort)) || !strings.Contains(rules, fmt.Sprint(portmapLocalPort)) {
		t.Fatalf("no portmap rule for the hostPorts in the node:\n%s", rules)
	}

	node := portmapNodeAddr + ":" + fmt.Sprint(portmapAnyPort)
	for _, c := range []struct {
		what, addr string
		from       ns.NetNS
	}{
		{"another namespace to node:hostPort", node, client},
		{"the node to its own address:hostPort", node, e.node},
		{"the node to 127.0.0.1:hostPort (hostIP 127.0.0.1)", "127.0.0.1:" + fmt.Sprint(portmapLocalPort), e.node},
	} {
		if got, err := fetch(c.from, c.addr); err != nil || got != portmapReply {
			t.Errorf("%s (%s): %q, %v; want the pod's reply", c.what, c.addr, got, err)
		}
	}
	if got, err := fetch(client, portmapNodeAddr+":"+fmt.Sprint(portmapLocalPort)); err == nil {
		t.Errorf("the hostIP 127.0.0.1 mapping answered on %s: %q", portmapNodeAddr, got)
	}

	if err := e.check(list, rt); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	// One mapping more than ADD made: portmap (which checks only when it
	// finds the pod's address in prevResult) counts the pod's rules.
	other := *rt
	other.CapabilityArgs = map[string]any{"portMappings": append(rt.CapabilityArgs["portMappings"].([]map[string]any),
		map[string]any{"hostPort": portmapAnyPort + 10, "containerPort": portmapPodPort, "protocol": "tcp"})}
	if err := e.check(list, &other); err == nil {
		t.Errorf("CHECK with a mapping portmap never made passed: portmap did not check the pod's rules")
	}

	if err := e.del(list, rt); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	if rules := dump(); strings.Contains(rules, fmt.Sprint(portmapAnyPort)) || strings.Contains(rules, fmt.Sprint(portmapLocalPort)) {
		t.Errorf("portmap rules left after DEL:\n%s", rules)
	}
	if got, err := fetch(client, node); err == nil {
		t.Errorf("%s still answers after DEL: %q", node, got)
	}
	if err := e.del(list, rt); err != nil {
		t.Errorf("second DEL: %v", err)
	}
	// GC (CNI 1.1.0) too goes to every plugin; nothing is left to collect.
	if err := e.gc(list, nil); err != nil {
		t.Errorf("GC of the chained list: %v", err)
	}
	e.assertNothingLeft(t, pod)
}

// setupPortmapNode makes the node namespace route like a node: forwarding
// on, lo up, the router address (the pods' gateway, which the node answers
// ARP for), and a link to the client namespace.
func setupPortmapNode(t *testing.T, e *cniEnv, client ns.NetNS) {
	t.Helper()
	err := e.inNode(func() error {
		if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
			return err
		}
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		// A local address on any link is answered for in ARP.
		if err := addAddr(lo, fakeGateway+"/32"); err != nil {
			return err
		}
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "hpn0"}, PeerName: "hpn1"}
		if err := netlink.LinkAdd(veth); err != nil {
			return err
		}
		if err := addAddr(veth, portmapNodeAddr+"/24"); err != nil {
			return err
		}
		peer, err := netlink.LinkByName("hpn1")
		if err != nil {
			return err
		}
		return netlink.LinkSetNsFd(peer, int(client.Fd()))
	})
	if err != nil {
		t.Fatalf("set up the node namespace: %v", err)
	}
	err = client.Do(func(ns.NetNS) error {
		peer, err := netlink.LinkByName("hpn1")
		if err != nil {
			return err
		}
		return addAddr(peer, portmapClientAddr+"/24")
	})
	if err != nil {
		t.Fatalf("set up the client namespace: %v", err)
	}
}

// addAddr gives l the address cidr and sets it up.
func addAddr(l netlink.Link, cidr string) error {
	a, err := netlink.ParseAddr(cidr)
	if err != nil {
		return err
	}
	if err := netlink.AddrAdd(l, a); err != nil {
		return err
	}
	return netlink.LinkSetUp(l)
}

// serve listens on portmapPodPort in the pod's namespace and answers every
// connection with portmapReply, until the test ends.
func serve(t *testing.T, pod ns.NetNS) {
	t.Helper()
	var ln net.Listener
	err := pod.Do(func(ns.NetNS) error {
		var err error
		ln, err = net.Listen("tcp4", fmt.Sprintf(":%d", portmapPodPort))
		return err
	})
	if err != nil {
		t.Fatalf("listen in the pod: %v", err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			_, _ = io.WriteString(c, portmapReply)
			_ = c.Close()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		wg.Wait()
	})
}

// fetch connects to addr from the namespace from and returns what the
// server sends before closing.
func fetch(from ns.NetNS, addr string) (string, error) {
	var c net.Conn
	err := from.Do(func(ns.NetNS) error {
		var err error
		c, err = net.DialTimeout("tcp4", addr, 3*time.Second)
		return err
	})
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	b, err := io.ReadAll(c)
	return string(b), err
}

// ruleDumper returns a function that prints the node namespace's packet
// filter rules through the backend portmap uses: iptables when
// iptables-save is installed (portmap's default), else nftables (the nft
// command, which portmap's nftables backend runs too). Without either,
// portmap cannot work: the test is skipped.
func ruleDumper(t *testing.T, e *cniEnv) func() string {
	t.Helper()
	var argv []string
	if p, err := exec.LookPath("iptables-save"); err == nil {
		argv = []string{p, "-t", "nat"}
	} else if p, err := exec.LookPath("nft"); err == nil {
		argv = []string{p, "list", "ruleset"}
	} else {
		t.Skip("neither iptables-save nor nft is installed: portmap has no backend")
	}
	return func() string {
		t.Helper()
		var out bytes.Buffer
		// Forked from the thread in the node's namespace: it runs there.
		err := e.inNode(func() error {
			cmd := exec.Command(argv[0], argv[1:]...)
			cmd.Stdout, cmd.Stderr = &out, &out
			return cmd.Run()
		})
		if err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(argv, " "), err, out.String())
		}
		return out.String()
	}
}
