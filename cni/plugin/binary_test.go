package plugin

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
)

// The tests in this file run the real binary through libcni (or, for
// input libcni would refuse to send, through invoke) and need no
// privileges: every case fails before the plugin touches a namespace.

func TestBinaryVersion(t *testing.T) {
	e := newCNIEnv(t, nil)
	info, err := e.cni.GetVersionInfo(context.Background(), PluginType)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := info.SupportedVersions(), []string{"0.3.1", "0.4.0", "1.0.0", "1.1.0"}; !slices.Equal(got, want) {
		t.Fatalf("supported versions %v, want %v", got, want)
	}
}

func TestBinaryStatus(t *testing.T) {
	e := newCNIEnv(t, nil)
	list := e.conflist("1.1.0", nil)
	if err := e.status(list); err != nil {
		t.Fatalf("STATUS with a healthy agent: %v", err)
	}

	// A degraded module does not stop ADD: STATUS stays ok.
	e.agent.set(func(a *fakeAgent) { a.health = "Degraded" })
	if err := e.status(list); err != nil {
		t.Fatalf("STATUS with a degraded agent: %v", err)
	}

	e.socket = filepath.Join(t.TempDir(), "nobody.sock")
	list = e.conflist("1.1.0", nil)
	err := e.status(list)
	wantCode(t, err, types.ErrPluginNotAvailable)
	if !strings.Contains(err.Error(), "nobody.sock") {
		t.Errorf("STATUS error %q does not name the socket", err)
	}
}

// rawArgs are CNI parameters for invoke, which, unlike libcni, sends the
// configuration bytes as they are.
func rawArgs(binDir, command, cniArgs string) *invoke.Args {
	return &invoke.Args{
		Command:       command,
		ContainerID:   "bad-input",
		NetNS:         "/var/run/netns/bad-input-does-not-exist",
		IfName:        "eth0",
		PluginArgsStr: cniArgs,
		Path:          binDir,
	}
}

const podArgs = "IgnoreUnknown=1;K8S_POD_NAMESPACE=test;K8S_POD_NAME=bad"

// TestBinaryBadInput: malformed configuration, missing or invalid
// arguments and an unknown network namespace get their CNI error code,
// and the agent is never asked for anything.
func TestBinaryBadInput(t *testing.T) {
	e := newCNIEnv(t, nil)
	plugin := filepath.Join(e.binDir, PluginType)
	good := `{"cniVersion":"1.0.0","name":"cellium","type":"cellium-cni","agent-socket":"` + e.socket + `"}`
	tests := []struct {
		name    string
		command string
		conf    string
		cniArgs string
		netns   string // overrides the default unknown netns when set
		code    uint
		inMsg   string
	}{
		{"not JSON", "ADD", `{"cniVersion":`, podArgs, "", types.ErrDecodingFailure, ""},
		{"mtu not a number", "ADD", `{"cniVersion":"1.0.0","name":"cellium","type":"cellium-cni","mtu":"big"}`, podArgs, "", types.ErrInvalidNetworkConfig, `"mtu"`},
		{"mtu out of range", "ADD", `{"cniVersion":"1.0.0","name":"cellium","type":"cellium-cni","mtu":10}`, podArgs, "", types.ErrInvalidNetworkConfig, "68..65535"},
		{"relative socket", "ADD", `{"cniVersion":"1.0.0","name":"cellium","type":"cellium-cni","agent-socket":"x.sock"}`, podArgs, "", types.ErrInvalidNetworkConfig, "agent-socket"},
		{"unsupported version", "ADD", `{"cniVersion":"0.2.0","name":"cellium","type":"cellium-cni"}`, podArgs, "", types.ErrIncompatibleCNIVersion, ""},
		{"no name", "ADD", `{"cniVersion":"1.0.0","type":"cellium-cni"}`, podArgs, "", types.ErrInvalidNetworkConfig, ""},
		{"chained", "ADD", `{"cniVersion":"1.0.0","name":"cellium","type":"cellium-cni","prevResult":{"cniVersion":"1.0.0"}}`, podArgs, "", types.ErrInvalidNetworkConfig, "chained"},
		{"bad config on DEL", "DEL", `{"cniVersion":"1.0.0","name":"cellium","type":"cellium-cni","mtu":"big"}`, podArgs, "", types.ErrInvalidNetworkConfig, ""},
		{"no pod args", "ADD", good, "", "", types.ErrInvalidEnvironmentVariables, "K8S_POD_NAMESPACE"},
		{"no pod name", "ADD", good, "K8S_POD_NAMESPACE=test", "", types.ErrInvalidEnvironmentVariables, "K8S_POD_NAME"},
		{"unknown arg", "ADD", good, "K8S_POD_NAMESPACE=test;K8S_POD_NAME=p;COLOR=blue", "", types.ErrInvalidEnvironmentVariables, "COLOR=blue"},
		{"malformed args", "ADD", good, "K8S_POD_NAMESPACE", "", types.ErrInvalidEnvironmentVariables, "CNI_ARGS"},
		{"unknown netns", "ADD", good, podArgs, "", types.ErrInvalidNetNS, "bad-input-does-not-exist"},
		{"netns not a namespace", "ADD", good, podArgs, "/etc/hostname", types.ErrInvalidNetNS, "/etc/hostname"},
		{"CHECK without prevResult", "CHECK", `{"cniVersion":"1.0.0","name":"cellium","type":"cellium-cni","agent-socket":"` + e.socket + `"}`,
			podArgs, "", types.ErrInvalidNetworkConfig, "prevResult"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := rawArgs(e.binDir, tt.command, tt.cniArgs)
			if tt.netns != "" {
				args.NetNS = tt.netns
			}
			var err error
			if tt.command == "ADD" {
				_, err = invoke.ExecPluginWithResult(context.Background(), plugin, []byte(tt.conf), args, nil)
			} else {
				err = invoke.ExecPluginWithoutResult(context.Background(), plugin, []byte(tt.conf), args, nil)
			}
			wantCode(t, err, tt.code)
			if !strings.Contains(err.Error(), tt.inMsg) {
				t.Errorf("error %q lacks %q", err, tt.inMsg)
			}
			if calls := e.agent.callLog(); len(calls) != 0 {
				t.Errorf("the agent was called: %v", calls)
			}
		})
	}
	e.agent.assertEmpty(t)
}

// TestBinaryMissingEnv: the CNI parameters themselves (CNI_NETNS on ADD,
// an invalid CNI_IFNAME) are checked by skel with code 4.
func TestBinaryMissingEnv(t *testing.T) {
	e := newCNIEnv(t, nil)
	plugin := filepath.Join(e.binDir, PluginType)
	conf := []byte(`{"cniVersion":"1.0.0","name":"cellium","type":"cellium-cni","agent-socket":"` + e.socket + `"}`)

	args := rawArgs(e.binDir, "ADD", podArgs)
	args.NetNS = ""
	_, err := invoke.ExecPluginWithResult(context.Background(), plugin, conf, args, nil)
	wantCode(t, err, types.ErrInvalidEnvironmentVariables)
	if !strings.Contains(err.Error(), "CNI_NETNS") {
		t.Errorf("error %q does not name CNI_NETNS", err)
	}

	args = rawArgs(e.binDir, "ADD", podArgs)
	args.IfName = "this-name-is-too-long"
	_, err = invoke.ExecPluginWithResult(context.Background(), plugin, conf, args, nil)
	wantCode(t, err, types.ErrInvalidEnvironmentVariables)

	if calls := e.agent.callLog(); len(calls) != 0 {
		t.Errorf("the agent was called: %v", calls)
	}
}
