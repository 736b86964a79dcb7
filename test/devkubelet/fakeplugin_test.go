package devkubelet

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/containernetworking/plugins/pkg/ns"
)

// fakePluginType is the type of the fake plugin the tests configure.
const fakePluginType = "fake-cni"

// fakeConf is the fake plugin's network configuration.
type fakeConf struct {
	types.PluginConf
	// Log receives one JSON fakeCall per call.
	Log string `json:"log"`
	// FailAddFile makes ADD fail with code 11 while the file exists.
	FailAddFile string `json:"failAddFile"`
}

// fakeCall is what the fake plugin logs about a call.
type fakeCall struct {
	Command     string `json:"command"`
	ContainerID string `json:"containerID"`
	Netns       string `json:"netns"`
	IfName      string `json:"ifName"`
	Args        string `json:"args"`
	IP          string `json:"ip,omitempty"`
	// PluginNetns is the network namespace the plugin ran in, as
	// /proc/self/ns/net reads ("net:[inode]").
	PluginNetns string `json:"pluginNetns"`
}

// fakeIP derives the pod address from the container ID.
func fakeIP(containerID string) net.IP {
	h := sha256.Sum256([]byte(containerID))
	return net.IPv4(10, 99, h[0], h[1]|1)
}

func fakePluginMain() {
	load := func(args *skel.CmdArgs) (*fakeConf, error) {
		var c fakeConf
		if err := json.Unmarshal(args.StdinData, &c); err != nil {
			return nil, types.NewError(types.ErrDecodingFailure, "bad conf", err.Error())
		}
		return &c, nil
	}
	logCall := func(c *fakeConf, cmd string, args *skel.CmdArgs, ip string) error {
		self, _ := os.Readlink("/proc/self/ns/net")
		line, _ := json.Marshal(fakeCall{Command: cmd, ContainerID: args.ContainerID, Netns: args.Netns, IfName: args.IfName, Args: args.Args, IP: ip,
			PluginNetns: self})
		f, err := os.OpenFile(c.Log, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = f.Write(append(line, '\n'))
		return err
	}
	add := func(args *skel.CmdArgs) error {
		c, err := load(args)
		if err != nil {
			return err
		}
		if c.FailAddFile != "" {
			if _, err := os.Stat(c.FailAddFile); err == nil {
				_ = logCall(c, "ADD-FAILED", args, "")
				return types.NewError(types.ErrTryAgainLater, "told to fail", c.FailAddFile)
			}
		}
		n, err := ns.GetNS(args.Netns)
		if err != nil {
			return types.NewError(types.ErrInvalidNetNS, "no netns", err.Error())
		}
		_ = n.Close()
		ip := fakeIP(args.ContainerID)
		if err := logCall(c, "ADD", args, ip.String()); err != nil {
			return err
		}
		idx := 1
		res := &types100.Result{
			CNIVersion: c.CNIVersion,
			Interfaces: []*types100.Interface{{Name: "fakehost0"}, {Name: args.IfName, Sandbox: args.Netns}},
			IPs:        []*types100.IPConfig{{Address: net.IPNet{IP: ip, Mask: net.CIDRMask(32, 32)}, Interface: &idx}},
		}
		return types.PrintResult(res, c.CNIVersion)
	}
	del := func(args *skel.CmdArgs) error {
		c, err := load(args)
		if err != nil {
			return err
		}
		return logCall(c, "DEL", args, "")
	}
	noop := func(*skel.CmdArgs) error { return nil }
	skel.PluginMainFuncs(skel.CNIFuncs{Add: add, Del: del, Check: noop, Status: noop}, version.All, "fake CNI plugin of the devkubelet tests")
}

// fakeNetwork sets up a CNI configuration and binary directory with the
// fake plugin and returns them with the path of the call log.
type fakeNetwork struct {
	confDir, binDir, log, failAdd string
}

func newFakeNetwork(t testing.TB, dir string) fakeNetwork {
	t.Helper()
	n := fakeNetwork{
		confDir: filepath.Join(dir, "net.d"),
		binDir:  filepath.Join(dir, "bin"),
		log:     filepath.Join(dir, "calls.log"),
		failAdd: filepath.Join(dir, "fail-add"),
	}
	for _, d := range []string{n.confDir, n.binDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(exe, filepath.Join(n.binDir, fakePluginType)); err != nil {
		t.Fatal(err)
	}
	return n
}

// install writes the conflist: the network becomes ready.
func (n fakeNetwork) install(t testing.TB) {
	t.Helper()
	conf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"fake","plugins":[{"type":%q,"log":%q,"failAddFile":%q}]}`,
		fakePluginType, n.log, n.failAdd)
	if err := os.WriteFile(filepath.Join(n.confDir, "10-fake.conflist"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
}

// calls returns the calls logged so far.
func (n fakeNetwork) calls(t testing.TB) []fakeCall {
	t.Helper()
	data, err := os.ReadFile(n.log)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var out []fakeCall
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if line == "" {
			continue
		}
		var c fakeCall
		if err := json.Unmarshal([]byte(line), &c); err != nil {
			t.Fatalf("call log: %v: %q", err, line)
		}
		out = append(out, c)
	}
	return out
}

// callsFor returns the commands logged for a container.
func (n fakeNetwork) callsFor(t testing.TB, containerID string) []string {
	var cmds []string
	for _, c := range n.calls(t) {
		if c.ContainerID == containerID {
			cmds = append(cmds, c.Command)
		}
	}
	return cmds
}
