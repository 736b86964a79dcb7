package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/containernetworking/plugins/pkg/ns"
)

// cniEnv runs the built cellium-cni binary through libcni, as a container
// runtime does, against a fake agent. When node is set, every plugin runs
// inside that network namespace: the calling goroutine is locked to a
// thread moved into it, and the plugin process forked from that thread
// starts there. The node's links are then the test's own, never the host's.
type cniEnv struct {
	t      testing.TB
	agent  *fakeAgent
	binDir string
	// paths are where libcni looks for plugins: binDir, then more.
	paths []string
	dir   string
	cni   *libcni.CNIConfig
	node  ns.NetNS
	// socket is the agent-socket the conflists name.
	socket string
}

func newCNIEnv(t testing.TB, node ns.NetNS) *cniEnv {
	t.Helper()
	e := &cniEnv{t: t, agent: newFakeAgent(t), binDir: pluginBinary(t), dir: t.TempDir(), node: node}
	e.socket = e.agent.socket
	e.paths = []string{e.binDir}
	e.cni = libcni.NewCNIConfigWithCacheDir(e.paths, filepath.Join(e.dir, "cache"), newExec())
	t.Cleanup(func() {
		if t.Failed() {
			if log, err := os.ReadFile(e.logFile()); err == nil {
				t.Logf("plugin log:\n%s", log)
			}
		}
	})
	return e
}

func (e *cniEnv) logFile() string { return filepath.Join(e.dir, "cellium-cni.log") }

// conflist writes a conflist of cniVersion with one cellium-cni plugin to
// the test's directory and loads it; extra keys go into the plugin's
// entry.
func (e *cniEnv) conflist(cniVersion string, extra map[string]any) *libcni.NetworkConfigList {
	e.t.Helper()
	plugin := map[string]any{
		"type":         PluginType,
		"agent-socket": e.socket,
		"enable-debug": true,
		"log-file":     e.logFile(),
	}
	for k, v := range extra {
		plugin[k] = v
	}
	data, err := json.Marshal(map[string]any{
		"cniVersion": cniVersion,
		"name":       NetworkName,
		"plugins":    []any{plugin},
	})
	if err != nil {
		e.t.Fatal(err)
	}
	path := filepath.Join(e.dir, "05-cellium.conflist")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		e.t.Fatal(err)
	}
	list, err := libcni.ConfListFromFile(path)
	if err != nil {
		e.t.Fatalf("load conflist: %v", err)
	}
	return list
}

// newExec is libcni's default way to run plugins, made up front: libcni
// makes it lazily, which races when one CNIConfig is used concurrently.
func newExec() invoke.Exec {
	return &invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: os.Stderr}, PluginDecoder: version.PluginDecoder{}}
}

// podRuntime is the runtime configuration kubelet's runtimes pass for a
// pod.
func podRuntime(containerID, netns, pod string) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{
		ContainerID: containerID,
		NetNS:       netns,
		IfName:      "eth0",
		Args: [][2]string{
			{"IgnoreUnknown", "1"},
			{"K8S_POD_NAMESPACE", "test"},
			{"K8S_POD_NAME", pod},
			{"K8S_POD_INFRA_CONTAINER_ID", containerID},
			{"K8S_POD_UID", "uid-" + pod},
		},
	}
}

// inNode runs f in the node's network namespace (see cniEnv).
func (e *cniEnv) inNode(f func() error) error {
	if e.node == nil {
		return f()
	}
	return e.node.Do(func(ns.NetNS) error { return f() })
}

func (e *cniEnv) add(list *libcni.NetworkConfigList, rt *libcni.RuntimeConf) (types.Result, error) {
	var res types.Result
	err := e.inNode(func() error {
		var err error
		res, err = e.cni.AddNetworkList(context.Background(), list, rt)
		return err
	})
	return res, err
}

func (e *cniEnv) del(list *libcni.NetworkConfigList, rt *libcni.RuntimeConf) error {
	return e.inNode(func() error { return e.cni.DelNetworkList(context.Background(), list, rt) })
}

func (e *cniEnv) check(list *libcni.NetworkConfigList, rt *libcni.RuntimeConf) error {
	return e.inNode(func() error { return e.cni.CheckNetworkList(context.Background(), list, rt) })
}

func (e *cniEnv) status(list *libcni.NetworkConfigList) error {
	return e.inNode(func() error { return e.cni.GetStatusNetworkList(context.Background(), list) })
}

// gc runs GC with its own empty libcni cache, so libcni issues no DEL of
// its own and only the plugin's GC acts.
func (e *cniEnv) gc(list *libcni.NetworkConfigList, valid []types.GCAttachment) error {
	c := libcni.NewCNIConfigWithCacheDir(e.paths, e.t.TempDir(), newExec())
	return e.inNode(func() error {
		return c.GCNetworkList(context.Background(), list, &libcni.GCArgs{ValidAttachments: valid})
	})
}

// cniCode returns the CNI error code of err, failing t if err is not a
// CNI error result.
func cniCode(t testing.TB, err error) uint {
	t.Helper()
	var e *types.Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v (%T) is not a CNI error result", err, err)
	}
	return e.Code
}

// wantCode fails t unless err is a CNI error with code.
func wantCode(t testing.TB, err error, code uint) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want CNI error code %d", code)
	}
	if got := cniCode(t, err); got != code {
		t.Fatalf("CNI error code %d, want %d: %v", got, code, err)
	}
}
