package plugin

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/cellium/cellium/api/v1/client"
)

// NetworkName and PluginType are the names in the conflist the agent
// installs (/etc/cni/net.d/05-cellium.conflist).
const (
	NetworkName = "cellium"
	PluginType  = "cellium-cni"
)

// MTU bounds of the netconf's "mtu": IPv4's minimum and a veth's maximum.
const (
	minMTU = 68
	maxMTU = 65535
)

// SupportedVersions returns the CNI specification versions the plugin
// speaks: 0.3.1 to 1.1.0.
func SupportedVersions() version.PluginInfo {
	return version.PluginSupports("0.3.1", "0.4.0", "1.0.0", "1.1.0")
}

// NetConf is the plugin's network configuration (its entry in the
// conflist, as the runtime passes it on stdin). Keys the plugin does not
// know are ignored.
type NetConf struct {
	types.PluginConf

	// MTU of the pod interface; 0 takes the agent's, which comes with the
	// address (POST /v1/ipam), or from GET /v1/config for older agents.
	MTU int `json:"mtu,omitempty"`

	// AgentSocket is the agent API socket; empty is
	// client.DefaultSocketPath.
	AgentSocket string `json:"agent-socket,omitempty"`

	// EnableDebug logs every step.
	EnableDebug bool `json:"enable-debug,omitempty"`

	// LogFile receives the plugin's log; empty logs warnings and errors to
	// stderr (and debug messages with EnableDebug).
	LogFile string `json:"log-file,omitempty"`
}

// ParseNetConf decodes and checks a network configuration. With
// prevResult set, it parses the "prevResult" into PrevResult.
//
// Errors (*types.Error): ErrDecodingFailure (6) for bytes that are not a
// JSON object; ErrIncompatibleCNIVersion (1) for an unsupported
// cniVersion; ErrInvalidNetworkConfig (7) for a key of the wrong type or a
// bad value, naming the key.
func ParseNetConf(data []byte, prevResult bool) (*NetConf, *types.Error) {
	var conf NetConf
	if err := json.Unmarshal(data, &conf); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return nil, newError(types.ErrInvalidNetworkConfig, "invalid network configuration",
				fmt.Sprintf("key %q must be a JSON %s, not %s", te.Field, jsonKind(te.Type.Kind().String()), te.Value))
		}
		return nil, newError(types.ErrDecodingFailure, "network configuration is not a valid JSON object", err.Error())
	}
	if !slices.Contains(SupportedVersions().SupportedVersions(), conf.CNIVersion) {
		return nil, newError(types.ErrIncompatibleCNIVersion, "incompatible CNI version",
			fmt.Sprintf("cniVersion %q is not one of %s", conf.CNIVersion,
				strings.Join(SupportedVersions().SupportedVersions(), ", ")))
	}
	if err := conf.validate(); err != nil {
		return nil, newError(types.ErrInvalidNetworkConfig, "invalid network configuration", err.Error())
	}
	if prevResult && conf.RawPrevResult != nil {
		if err := version.ParsePrevResult(&conf.PluginConf); err != nil {
			return nil, newError(types.ErrInvalidNetworkConfig, "invalid prevResult", err.Error())
		}
	}
	return &conf, nil
}

func (c *NetConf) validate() error {
	if c.Name == "" {
		return errors.New(`"name" is empty; the network is usually "` + NetworkName + `"`)
	}
	if c.MTU != 0 && (c.MTU < minMTU || c.MTU > maxMTU) {
		return fmt.Errorf(`"mtu" %d is outside %d..%d; leave it out to use the agent's MTU`, c.MTU, minMTU, maxMTU)
	}
	if c.AgentSocket != "" && !filepath.IsAbs(c.AgentSocket) {
		return fmt.Errorf(`"agent-socket" %q is not an absolute path`, c.AgentSocket)
	}
	if c.LogFile != "" && !filepath.IsAbs(c.LogFile) {
		return fmt.Errorf(`"log-file" %q is not an absolute path`, c.LogFile)
	}
	return nil
}

// socket returns the agent API socket to use.
func (c *NetConf) socket() string {
	if c.AgentSocket != "" {
		return c.AgentSocket
	}
	return client.DefaultSocketPath
}

// jsonKind names a Go kind the way a netconf author knows it.
func jsonKind(kind string) string {
	switch kind {
	case "int", "int8", "int16", "int32", "int64", "uint", "uint8", "uint16", "uint32", "uint64", "float32", "float64":
		return "number"
	case "bool":
		return "boolean"
	case "slice", "array":
		return "array"
	case "map", "struct":
		return "object"
	}
	return kind
}

// K8sArgs are the CNI_ARGS the plugin reads. The field names are the keys
// (kubelet's and the CRI runtimes' names).
type K8sArgs struct {
	types.CommonArgs
	K8S_POD_NAMESPACE          types.UnmarshallableString
	K8S_POD_NAME               types.UnmarshallableString
	K8S_POD_INFRA_CONTAINER_ID types.UnmarshallableString
	K8S_POD_UID                types.UnmarshallableString
}

// ParseArgs parses CNI_ARGS ("K=V;K2=V2"). Keys other than the K8S_POD_*
// ones are an error unless IgnoreUnknown=1 is among them, as the CNI
// conventions say (kubelet's runtimes always pass it).
//
// Errors (*types.Error): ErrInvalidEnvironmentVariables (4), naming
// CNI_ARGS.
func ParseArgs(s string) (*K8sArgs, *types.Error) {
	var a K8sArgs
	if err := types.LoadArgs(s, &a); err != nil {
		return nil, newError(types.ErrInvalidEnvironmentVariables, "invalid CNI_ARGS", err.Error())
	}
	return &a, nil
}

// pod returns the pod's namespace and name, which ADD needs.
//
// Errors (*types.Error): ErrInvalidEnvironmentVariables (4) when CNI_ARGS
// lacks K8S_POD_NAMESPACE or K8S_POD_NAME or they are not Kubernetes
// names.
func (a *K8sArgs) pod() (namespace, name string, _ *types.Error) {
	namespace, name = string(a.K8S_POD_NAMESPACE), string(a.K8S_POD_NAME)
	var missing []string
	if namespace == "" {
		missing = append(missing, "K8S_POD_NAMESPACE")
	}
	if name == "" {
		missing = append(missing, "K8S_POD_NAME")
	}
	if len(missing) > 0 {
		return "", "", newError(types.ErrInvalidEnvironmentVariables, "CNI_ARGS lacks the pod",
			fmt.Sprintf("CNI_ARGS has no %s; the runtime must pass the pod as K8S_POD_NAMESPACE=<ns>;K8S_POD_NAME=<pod>",
				strings.Join(missing, " or ")))
	}
	for key, v := range map[string]string{"K8S_POD_NAMESPACE": namespace, "K8S_POD_NAME": name} {
		if strings.ContainsAny(v, "/ \t\n") || len(v) > 253 {
			return "", "", newError(types.ErrInvalidEnvironmentVariables, "invalid CNI_ARGS",
				fmt.Sprintf("CNI_ARGS %s=%q is not a Kubernetes name", key, v))
		}
	}
	return namespace, name, nil
}
