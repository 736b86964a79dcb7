package plugin

import (
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/cellium/cellium/api/v1/client"
)

func TestParseNetConf(t *testing.T) {
	tests := []struct {
		name string
		conf string
		// code is the expected CNI error code, 0 for success.
		code uint
		// inDetails must appear in the error's message or details.
		inDetails string
		check     func(t *testing.T, c *NetConf)
	}{
		{
			name: "minimal",
			conf: `{"cniVersion":"1.1.0","name":"cellium","type":"cellium-cni"}`,
			check: func(t *testing.T, c *NetConf) {
				if c.MTU != 0 || c.socket() != client.DefaultSocketPath || c.EnableDebug || c.LogFile != "" {
					t.Errorf("defaults: %+v socket %s", c, c.socket())
				}
			},
		},
		{
			name: "every key",
			conf: `{"cniVersion":"0.3.1","name":"cellium","type":"cellium-cni","mtu":1400,
				"agent-socket":"/run/x/agent.sock","enable-debug":true,"log-file":"/var/log/cni.log",
				"unknown-key":{"ignored":true}}`,
			check: func(t *testing.T, c *NetConf) {
				if c.MTU != 1400 || c.socket() != "/run/x/agent.sock" || !c.EnableDebug || c.LogFile != "/var/log/cni.log" || c.Name != "cellium" {
					t.Errorf("parsed %+v", c)
				}
			},
		},
		{name: "each supported version 0.4.0", conf: `{"cniVersion":"0.4.0","name":"n"}`},
		{name: "each supported version 1.0.0", conf: `{"cniVersion":"1.0.0","name":"n"}`},
		{name: "not JSON", conf: `{"cniVersion":"1.1.0",`, code: types.ErrDecodingFailure},
		{name: "JSON array", conf: `[1,2]`, code: types.ErrDecodingFailure, inDetails: "not a valid JSON object"},
		{name: "mtu is a string", conf: `{"cniVersion":"1.1.0","name":"n","mtu":"big"}`, code: types.ErrInvalidNetworkConfig, inDetails: `"mtu" must be a JSON number`},
		{name: "enable-debug is a string", conf: `{"cniVersion":"1.1.0","name":"n","enable-debug":"yes"}`, code: types.ErrInvalidNetworkConfig, inDetails: `"enable-debug" must be a JSON boolean`},
		{name: "mtu too small", conf: `{"cniVersion":"1.1.0","name":"n","mtu":60}`, code: types.ErrInvalidNetworkConfig, inDetails: "outside 68..65535"},
		{name: "mtu too large", conf: `{"cniVersion":"1.1.0","name":"n","mtu":70000}`, code: types.ErrInvalidNetworkConfig},
		{name: "relative socket", conf: `{"cniVersion":"1.1.0","name":"n","agent-socket":"agent.sock"}`, code: types.ErrInvalidNetworkConfig, inDetails: "agent-socket"},
		{name: "relative log file", conf: `{"cniVersion":"1.1.0","name":"n","log-file":"cni.log"}`, code: types.ErrInvalidNetworkConfig, inDetails: "log-file"},
		{name: "no name", conf: `{"cniVersion":"1.1.0"}`, code: types.ErrInvalidNetworkConfig, inDetails: `"name"`},
		{name: "old version", conf: `{"cniVersion":"0.2.0","name":"n"}`, code: types.ErrIncompatibleCNIVersion, inDetails: "0.3.1, 0.4.0, 1.0.0, 1.1.0"},
		{name: "future version", conf: `{"cniVersion":"2.0.0","name":"n"}`, code: types.ErrIncompatibleCNIVersion},
		{name: "no version", conf: `{"name":"n"}`, code: types.ErrIncompatibleCNIVersion},
		{
			name: "prevResult",
			conf: `{"cniVersion":"1.0.0","name":"n","prevResult":{"cniVersion":"1.0.0",
				"interfaces":[{"name":"eth0","sandbox":"/ns"}],"ips":[{"address":"10.0.0.2/32","interface":0}]}}`,
			check: func(t *testing.T, c *NetConf) {
				if c.PrevResult == nil || c.PrevResult.Version() != "1.0.0" {
					t.Errorf("prevResult not parsed: %+v", c.PrevResult)
				}
			},
		},
		{name: "bad prevResult", conf: `{"cniVersion":"1.0.0","name":"n","prevResult":{"cniVersion":"1.0.0","ips":[{"address":"nope"}]}}`, code: types.ErrInvalidNetworkConfig},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := ParseNetConf([]byte(tt.conf), true)
			if tt.code == 0 {
				if err != nil {
					t.Fatalf("error %v", err)
				}
				if tt.check != nil {
					tt.check(t, c)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, want code %d", tt.code)
			}
			if err.Code != tt.code {
				t.Fatalf("code %d (%v), want %d", err.Code, err, tt.code)
			}
			if !strings.Contains(err.Msg+" "+err.Details, tt.inDetails) {
				t.Fatalf("error %q lacks %q", err.Msg+": "+err.Details, tt.inDetails)
			}
		})
	}
}

func TestParseArgs(t *testing.T) {
	tests := []struct {
		name      string
		args      string
		code      uint // for ParseArgs
		podCode   uint // for pod()
		inDetails string
		ns, pod   string
		uid       string
	}{
		{
			name: "kubelet",
			args: "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=1234-5678",
			ns:   "default", pod: "web-0", uid: "1234-5678",
		},
		{name: "without uid", args: "K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=dns", ns: "kube-system", pod: "dns"},
		{name: "unknown key ignored", args: "IgnoreUnknown=true;FOO=bar;K8S_POD_NAMESPACE=a;K8S_POD_NAME=b", ns: "a", pod: "b"},
		{name: "unknown key", args: "FOO=bar;K8S_POD_NAMESPACE=a;K8S_POD_NAME=b", code: types.ErrInvalidEnvironmentVariables, inDetails: "FOO=bar"},
		{name: "malformed pair", args: "K8S_POD_NAMESPACE", code: types.ErrInvalidEnvironmentVariables, inDetails: "invalid pair"},
		{name: "empty", args: "", podCode: types.ErrInvalidEnvironmentVariables, inDetails: "K8S_POD_NAMESPACE or K8S_POD_NAME"},
		{name: "no name", args: "K8S_POD_NAMESPACE=a", podCode: types.ErrInvalidEnvironmentVariables, inDetails: "CNI_ARGS has no K8S_POD_NAME"},
		{name: "no namespace", args: "K8S_POD_NAME=a", podCode: types.ErrInvalidEnvironmentVariables, inDetails: "K8S_POD_NAMESPACE"},
		{name: "slash in name", args: "K8S_POD_NAMESPACE=a;K8S_POD_NAME=b/c", podCode: types.ErrInvalidEnvironmentVariables, inDetails: "not a Kubernetes name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, err := ParseArgs(tt.args)
			if tt.code != 0 {
				if err == nil || err.Code != tt.code || !strings.Contains(err.Details, tt.inDetails) {
					t.Fatalf("ParseArgs error %v, want code %d with %q", err, tt.code, tt.inDetails)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			ns, pod, perr := a.pod()
			if tt.podCode != 0 {
				if perr == nil || perr.Code != tt.podCode || !strings.Contains(perr.Details, tt.inDetails) {
					t.Fatalf("pod() error %v, want code %d with %q", perr, tt.podCode, tt.inDetails)
				}
				if !strings.Contains(perr.Details, "CNI_ARGS") {
					t.Fatalf("error %q does not name CNI_ARGS, as the spec asks for code 4", perr.Details)
				}
				return
			}
			if perr != nil {
				t.Fatal(perr)
			}
			if ns != tt.ns || pod != tt.pod || string(a.K8S_POD_UID) != tt.uid {
				t.Fatalf("got %s/%s uid %q", ns, pod, a.K8S_POD_UID)
			}
		})
	}
}
