package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	cnitypes "github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/cellium/cellium/datapath/link"
	"github.com/cellium/cellium/test/devkubelet"
)

// pluginCall is one direct run of cellium-cni, as a runtime makes it.
type pluginCall struct {
	command     string
	containerID string
	netns       string
	args        string // CNI_ARGS
	stdin       []byte
	omitNetns   bool
}

// runPlugin runs cellium-cni and returns its stdout and the code of its
// error result (0 on success).
func (e *env) runPlugin(c pluginCall) ([]byte, uint) {
	e.t.Helper()
	bin := filepath.Join(e.node.CNIBinDir(), "cellium-cni")
	cmd := exec.CommandContext(e.ctx, bin)
	cmd.Env = []string{
		"CNI_COMMAND=" + c.command,
		"CNI_CONTAINERID=" + c.containerID,
		"CNI_IFNAME=eth0",
		"CNI_ARGS=" + c.args,
		"CNI_PATH=" + e.node.CNIBinDir(),
		"PATH=" + os.Getenv("PATH"),
	}
	if !c.omitNetns {
		cmd.Env = append(cmd.Env, "CNI_NETNS="+c.netns)
	}
	cmd.Stdin = bytes.NewReader(c.stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err == nil {
		return stdout.Bytes(), 0
	}
	var cniErr cnitypes.Error
	if jerr := json.Unmarshal(stdout.Bytes(), &cniErr); jerr != nil || cniErr.Code == 0 {
		e.t.Fatalf("cellium-cni %s failed (%v) without a CNI error result: stdout %q stderr %q", c.command, err, stdout.String(), stderr.String())
	}
	return stdout.Bytes(), cniErr.Code
}

// netconf returns the plugin's configuration as the runtime passes it:
// the agent's conflist entry with cniVersion and name, modified by edit.
func (e *env) netconf(edit func(map[string]any)) []byte {
	e.t.Helper()
	data, err := os.ReadFile(e.node.AgentConfig().ConfListPath())
	if err != nil {
		e.t.Fatal(err)
	}
	var list struct {
		CNIVersion string           `json:"cniVersion"`
		Name       string           `json:"name"`
		Plugins    []map[string]any `json:"plugins"`
	}
	if err := json.Unmarshal(data, &list); err != nil || len(list.Plugins) != 1 {
		e.t.Fatalf("agent conflist %s: %v", data, err)
	}
	conf := list.Plugins[0]
	conf["cniVersion"], conf["name"] = list.CNIVersion, list.Name
	if edit != nil {
		edit(conf)
	}
	out, _ := json.Marshal(conf)
	return out
}

// newNetns makes a pod network namespace removed at the end of the test.
func newNetns(t *testing.T) ns.NetNS {
	t.Helper()
	n, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = n.Close()
		_ = testutils.UnmountNS(n)
	})
	return n
}

// podArgs are the CNI_ARGS of a pod of the test's namespace.
func (e *env) podArgs(pod, containerID string) string {
	return fmt.Sprintf("IgnoreUnknown=1;K8S_POD_NAMESPACE=%s;K8S_POD_NAME=%s;K8S_POD_INFRA_CONTAINER_ID=%s", e.ns, pod, containerID)
}

// leftovers says what an ADD of containerID for pod left behind: a host
// link named for it or carrying its ID in its alias, an interface other
// than lo in the pod's netns, an endpoint, an IP. checkAgent false skips
// the agent (it is down).
func (e *env) leftovers(containerID, pod string, podNS ns.NetNS, checkAgent bool) error {
	host := link.HostInterfaceName(containerID, "eth0")
	if _, ok := linkExists(host); ok {
		return fmt.Errorf("host link %s left", host)
	}
	links, err := netlink.LinkList()
	if err != nil {
		return err
	}
	for _, l := range links {
		if strings.Contains(l.Attrs().Alias, containerID) {
			return fmt.Errorf("host link %s (alias %q) left", l.Attrs().Name, l.Attrs().Alias)
		}
	}
	if podNS != nil {
		var names []string
		err := podNS.Do(func(ns.NetNS) error {
			ls, err := netlink.LinkList()
			for _, l := range ls {
				if l.Attrs().Name != "lo" {
					names = append(names, l.Attrs().Name)
				}
			}
			return err
		})
		if err != nil {
			return err
		}
		if len(names) > 0 {
			return fmt.Errorf("interfaces %v left in the pod's netns", names)
		}
	}
	if !checkAgent {
		return nil
	}
	eps, err := e.agent.GetEndpoints(e.ctx)
	if err != nil {
		return err
	}
	for _, ep := range eps {
		if ep.Spec != nil && ep.Spec.ContainerID == containerID {
			return fmt.Errorf("endpoint %d of container %s left", ep.ID, containerID[:12])
		}
	}
	allocs, err := e.allocations()
	if err != nil {
		return err
	}
	for ip, owner := range allocs {
		if owner == e.ns+"/"+pod {
			return fmt.Errorf("IP %s left allocated to %s", ip, owner)
		}
	}
	return nil
}

func containerID() string { return rand.String(64) }

// TestPrivilegedCNIBadInput runs the real plugin against the real agent
// the way a runtime would, with bad input: each ADD fails with the CNI
// error code the specification gives and leaves nothing behind (no veth,
// no interface in the pod, no endpoint, no IP). DEL of unknown containers
// and netns succeeds; ADD and DEL with the agent down fail with 11 ("try
// again later") and leave nothing either.
func TestPrivilegedCNIBadInput(t *testing.T) {
	e := newEnv(t, envOptions{})
	// The test is the runtime: the kubelet stays out of the way, but the
	// pods exist, bound to the node, as they would for a real runtime.
	if err := e.node.StopKubelet(); err != nil {
		t.Fatal(err)
	}
	e.createPods(map[string]map[string]string{"bad": {"app": "bad"}})

	cases := []struct {
		name string
		call func(id string, n ns.NetNS) pluginCall
		code uint
	}{
		{"config is not JSON", func(id string, n ns.NetNS) pluginCall {
			return pluginCall{stdin: []byte(`{"cniVersion": "1.0.0", "name": `), netns: n.Path(), args: e.podArgs("bad", id)}
		}, cnitypes.ErrDecodingFailure},
		{"config value of the wrong type", func(id string, n ns.NetNS) pluginCall {
			return pluginCall{stdin: e.netconf(func(c map[string]any) { c["mtu"] = "big" }), netns: n.Path(), args: e.podArgs("bad", id)}
		}, cnitypes.ErrInvalidNetworkConfig},
		{"config value out of range", func(id string, n ns.NetNS) pluginCall {
			return pluginCall{stdin: e.netconf(func(c map[string]any) { c["mtu"] = 10 }), netns: n.Path(), args: e.podArgs("bad", id)}
		}, cnitypes.ErrInvalidNetworkConfig},
		{"unsupported cniVersion", func(id string, n ns.NetNS) pluginCall {
			return pluginCall{stdin: e.netconf(func(c map[string]any) { c["cniVersion"] = "0.1.0" }), netns: n.Path(), args: e.podArgs("bad", id)}
		}, cnitypes.ErrIncompatibleCNIVersion},
		{"CNI_ARGS without the pod", func(id string, n ns.NetNS) pluginCall {
			return pluginCall{stdin: e.netconf(nil), netns: n.Path(), args: "IgnoreUnknown=1"}
		}, cnitypes.ErrInvalidEnvironmentVariables},
		{"no CNI_NETNS", func(id string, n ns.NetNS) pluginCall {
			return pluginCall{stdin: e.netconf(nil), omitNetns: true, args: e.podArgs("bad", id)}
		}, cnitypes.ErrInvalidEnvironmentVariables},
		{"unknown netns", func(id string, n ns.NetNS) pluginCall {
			return pluginCall{stdin: e.netconf(nil), netns: "/var/run/netns/cellium-e2e-no-such-netns", args: e.podArgs("bad", id)}
		}, cnitypes.ErrInvalidNetNS},
		{"agent socket missing", func(id string, n ns.NetNS) pluginCall {
			return pluginCall{stdin: e.netconf(func(c map[string]any) { c["agent-socket"] = "/nonexistent/cellium.sock" }),
				netns: n.Path(), args: e.podArgs("bad", id)}
		}, cnitypes.ErrTryAgainLater},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			id := containerID()
			n := newNetns(t)
			c := tc.call(id, n)
			c.command, c.containerID = "ADD", id
			out, code := e.runPlugin(c)
			if code != tc.code {
				t.Fatalf("ADD: code %d, want %d: %s", code, tc.code, out)
			}
			if err := e.leftovers(id, "bad", n, true); err != nil {
				t.Errorf("after a failed ADD: %v", err)
			}
		})
	}

	t.Run("DEL of unknown things", func(t *testing.T) {
		n := newNetns(t)
		for _, netnsPath := range []string{n.Path(), "/var/run/netns/cellium-e2e-no-such-netns", ""} {
			id := containerID()
			if out, code := e.runPlugin(pluginCall{command: "DEL", containerID: id, netns: netnsPath,
				args: e.podArgs("bad", id), stdin: e.netconf(nil)}); code != 0 {
				t.Errorf("DEL of an unknown container (netns %q): code %d: %s", netnsPath, code, out)
			}
		}
	})

	t.Run("agent down", func(t *testing.T) {
		id := containerID()
		n := newNetns(t)
		conf := e.netconf(nil)
		if err := e.node.StopAgent(); err != nil {
			t.Fatal(err)
		}
		restarted := false
		defer func() {
			if !restarted {
				if err := e.node.StartAgent(context.Background()); err != nil {
					t.Errorf("restart agent: %v", err)
				}
			}
		}()
		if out, code := e.runPlugin(pluginCall{command: "ADD", containerID: id, netns: n.Path(), args: e.podArgs("bad", id), stdin: conf}); code != cnitypes.ErrTryAgainLater {
			t.Errorf("ADD with the agent down: code %d, want 11: %s", code, out)
		}
		if err := e.leftovers(id, "bad", n, false); err != nil {
			t.Errorf("after ADD with the agent down: %v", err)
		}
		if out, code := e.runPlugin(pluginCall{command: "DEL", containerID: id, netns: n.Path(), args: e.podArgs("bad", id), stdin: conf}); code != cnitypes.ErrTryAgainLater {
			t.Errorf("DEL with the agent down: code %d, want 11: %s", code, out)
		}
		if err := e.node.StartAgent(e.ctx); err != nil {
			t.Fatal(err)
		}
		restarted = true
		if err := e.leftovers(id, "bad", n, true); err != nil {
			t.Errorf("after the agent came back: %v", err)
		}
		if out, code := e.runPlugin(pluginCall{command: "DEL", containerID: id, netns: n.Path(), args: e.podArgs("bad", id), stdin: conf}); code != 0 {
			t.Errorf("DEL retried with the agent back: code %d: %s", code, out)
		}
	})
}

// TestPrivilegedCNIConcurrentAdds: 50 ADDs at once through libcni, as a
// runtime starting 50 sandboxes, all succeed with distinct addresses and
// ready endpoints; 50 DELs at once leave nothing.
func TestPrivilegedCNIConcurrentAdds(t *testing.T) {
	e := newEnv(t, envOptions{})
	if err := e.node.StopKubelet(); err != nil {
		t.Fatal(err)
	}
	const n = 50
	spec := map[string]map[string]string{}
	for i := range n {
		spec[fmt.Sprintf("conc-%02d", i)] = map[string]string{"app": fmt.Sprintf("conc-%d", i%3)}
	}
	e.createPods(spec)
	list, err := libcni.ConfListFromFile(e.node.AgentConfig().ConfListPath())
	if err != nil {
		t.Fatal(err)
	}
	cni := devkubelet.NewCNIConfig([]string{e.node.CNIBinDir()}, t.TempDir())
	type attach struct {
		pod string
		rt  *libcni.RuntimeConf
		ns  ns.NetNS
		ip  string
		add time.Duration
	}
	atts := make([]*attach, n)
	for i := range n {
		pod := fmt.Sprintf("conc-%02d", i)
		id := containerID()
		netns := newNetns(t)
		atts[i] = &attach{pod: pod, ns: netns, rt: &libcni.RuntimeConf{
			ContainerID: id, NetNS: netns.Path(), IfName: "eth0",
			Args: [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", e.ns}, {"K8S_POD_NAME", pod}, {"K8S_POD_INFRA_CONTAINER_ID", id}},
		}}
	}
	// Whatever happens, DEL everything at the end.
	t.Cleanup(func() {
		for _, a := range atts {
			_ = cni.DelNetworkList(context.Background(), list, a.rt)
		}
	})
	var wg sync.WaitGroup
	errs := make([]error, n)
	start := time.Now()
	for i, a := range atts {
		wg.Go(func() {
			t0 := time.Now()
			res, err := cni.AddNetworkList(e.ctx, list, a.rt)
			a.add = time.Since(t0)
			if err != nil {
				errs[i] = fmt.Errorf("ADD %s: %w", a.pod, err)
				return
			}
			cur, err := types100.NewResultFromResult(res)
			if err != nil || len(cur.IPs) != 1 {
				errs[i] = fmt.Errorf("ADD %s: result %v (%v)", a.pod, res, err)
				return
			}
			a.ip = cur.IPs[0].Address.IP.String()
		})
	}
	wg.Wait()
	took := time.Since(start)
	for _, err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	ips := map[string]string{}
	var lat []time.Duration
	for _, a := range atts {
		if other, ok := ips[a.ip]; ok {
			t.Errorf("%s and %s both got %s", a.pod, other, a.ip)
		}
		ips[a.ip] = a.pod
		lat = append(lat, a.add)
	}
	t.Logf("%d concurrent ADDs in %s: p50 %s, p99 %s", n, took.Round(time.Millisecond),
		devkubelet.Percentile(lat, 50).Round(time.Millisecond), devkubelet.Percentile(lat, 99).Round(time.Millisecond))

	eventually(t, 30*time.Second, "50 ready endpoints and CEPs", func() error {
		eps, err := e.endpoints()
		if err != nil {
			return err
		}
		ceps, err := e.ceps()
		if err != nil {
			return err
		}
		for _, a := range atts {
			ep, ok := eps[a.pod]
			if !ok || ep.Spec.Addressing.IPV4 != a.ip {
				return fmt.Errorf("endpoint of %s: %+v", a.pod, ep.Spec)
			}
			if c := ceps[a.pod]; c == nil || c.Status.State != "ready" {
				return fmt.Errorf("CEP of %s not ready", a.pod)
			}
		}
		return nil
	})

	for i, a := range atts {
		wg.Go(func() {
			errs[i] = cni.DelNetworkList(e.ctx, list, a.rt)
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Errorf("DEL: %v", err)
		}
	}
	eventually(t, 30*time.Second, "nothing left after 50 DELs", func() error {
		for _, a := range atts {
			if err := e.leftovers(a.rt.ContainerID, a.pod, a.ns, true); err != nil {
				return fmt.Errorf("%s: %w", a.pod, err)
			}
		}
		ceps, err := e.ceps()
		if err != nil {
			return err
		}
		if len(ceps) > 0 {
			return fmt.Errorf("%d CEPs left", len(ceps))
		}
		return nil
	})
	zero := int64(0)
	e.deletePods(sortedKeys(spec), &zero)
}
