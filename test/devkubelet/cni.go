package devkubelet

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	cnitypes "github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/containernetworking/plugins/pkg/ns"
)

// PodInterface is the name of the pod's interface (CNI_IFNAME), as
// kubelet's runtimes name it.
const PodInterface = "eth0"

// errNoNetwork says the CNI configuration directory holds no usable
// network yet: the node is not ready and pods wait.
var errNoNetwork = errors.New("network not ready: no CNI network configuration")

// cniRuntime calls CNI plugins the way a container runtime does: the
// network is the first configuration file (in lexical order) of the
// configuration directory; plugins are looked up by type in the binary
// directories; libcni keeps its result cache in cacheDir.
type cniRuntime struct {
	confDir string
	cni     *libcni.CNIConfig
}

// newCNIRuntime returns the runtime; with pluginNetns set, plugins run in
// that network namespace.
func newCNIRuntime(confDir string, binDirs []string, cacheDir, pluginNetns string) *cniRuntime {
	exec := newExec()
	if pluginNetns != "" {
		exec = &netnsExec{Exec: exec, netns: pluginNetns}
	}
	return &cniRuntime{confDir: confDir, cni: libcni.NewCNIConfigWithCacheDir(binDirs, cacheDir, exec)}
}

func newExec() invoke.Exec {
	return &invoke.DefaultExec{
		RawExec:       &invoke.RawExec{Stderr: os.Stderr},
		PluginDecoder: version.PluginDecoder{},
	}
}

// netnsExec runs each plugin in a network namespace: the fork happens on
// an OS thread switched into it, and the child keeps it.
type netnsExec struct {
	invoke.Exec
	netns string
}

func (e *netnsExec) ExecPlugin(ctx context.Context, pluginPath string, stdinData []byte, environ []string) ([]byte, error) {
	nsh, err := ns.GetNS(e.netns)
	if err != nil {
		return nil, fmt.Errorf("plugin network namespace: %w", err)
	}
	defer nsh.Close()
	var out []byte
	err = nsh.Do(func(ns.NetNS) error {
		var err error
		out, err = e.Exec.ExecPlugin(ctx, pluginPath, stdinData, environ)
		return err
	})
	return out, err
}

// NewCNIConfig returns a libcni runtime that finds plugins in binDirs and
// caches results in cacheDir, safe for concurrent calls. (libcni picks
// its default exec lazily, unsynchronized, when given none.) The
// plugins' standard error goes to ours.
func NewCNIConfig(binDirs []string, cacheDir string) *libcni.CNIConfig {
	return libcni.NewCNIConfigWithCacheDir(binDirs, cacheDir, newExec())
}

// network loads the network from the configuration directory: the first
// file ending in .conflist, .conf or .json that parses as a conflist.
// Files that do not parse are passed over, as containerd does.
//
// Errors: errNoNetwork (wrapped, with the reason) when there is none.
func (r *cniRuntime) network() (*libcni.NetworkConfigList, error) {
	files, err := libcni.ConfFiles(r.confDir, []string{".conflist", ".conf", ".json"})
	if err != nil {
		return nil, fmt.Errorf("%w: read %s: %v", errNoNetwork, r.confDir, err)
	}
	slices.Sort(files)
	var errs []error
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		list, err := libcni.NetworkConfFromBytes(data)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", filepath.Base(f), err))
			continue
		}
		if len(list.Plugins) == 0 {
			errs = append(errs, fmt.Errorf("%s: no plugins", filepath.Base(f)))
			continue
		}
		return list, nil
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%w in %s: %w", errNoNetwork, r.confDir, errors.Join(errs...))
	}
	return nil, fmt.Errorf("%w in %s", errNoNetwork, r.confDir)
}

// runtimeConf is the per-call configuration of a sandbox: the CNI_ARGS
// kubelet's runtimes pass.
func runtimeConf(sb *Sandbox) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{
		ContainerID: sb.ID,
		NetNS:       sb.NetnsPath,
		IfName:      sb.IfName,
		Args: [][2]string{
			{"IgnoreUnknown", "1"},
			{"K8S_POD_NAMESPACE", sb.Namespace},
			{"K8S_POD_NAME", sb.Name},
			{"K8S_POD_INFRA_CONTAINER_ID", sb.ID},
			{"K8S_POD_UID", string(sb.UID)},
		},
	}
}

// add runs CNI ADD for the sandbox and returns the result in the current
// format.
func (r *cniRuntime) add(ctx context.Context, list *libcni.NetworkConfigList, sb *Sandbox) (*types100.Result, error) {
	res, err := r.cni.AddNetworkList(ctx, list, runtimeConf(sb))
	if err != nil {
		return nil, err
	}
	cur, err := types100.NewResultFromResult(res)
	if err != nil {
		return nil, fmt.Errorf("CNI result of %s: %w", list.Name, err)
	}
	return cur, nil
}

// del runs CNI DEL for the sandbox with the configuration ADD used.
func (r *cniRuntime) del(ctx context.Context, sb *Sandbox) error {
	if len(sb.ConfList) == 0 {
		// ADD never ran: nothing was attached.
		return nil
	}
	list, err := libcni.NetworkConfFromBytes(sb.ConfList)
	if err != nil {
		return fmt.Errorf("network configuration of sandbox %s: %w", sb.ID, err)
	}
	return r.cni.DelNetworkList(ctx, list, runtimeConf(sb))
}

// CNIErrorCode returns the code of a CNI error result (the plugin's
// *types.Error), or 0 when err is not one.
func CNIErrorCode(err error) uint {
	var e *cnitypes.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return 0
}

// podIP returns the pod's IPv4 (else first) address and the host-side
// interfaces of a result.
func podIP(res *types100.Result) (ip string, hostIfs []string) {
	for _, c := range res.IPs {
		if c.Address.IP.To4() != nil {
			ip = c.Address.IP.String()
			break
		}
		if ip == "" {
			ip = c.Address.IP.String()
		}
	}
	for _, i := range res.Interfaces {
		if i.Sandbox == "" {
			hostIfs = append(hostIfs, i.Name)
		}
	}
	return ip, hostIfs
}
