package soak

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	cnitypes "github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"

	"github.com/cellium/cellium/test/devkubelet"
)

// cniTimeout bounds one run of the plugin.
const cniTimeout = 2 * time.Minute

// cniCall is one run of the CNI plugin by the soak, as a runtime's retry
// would make it: the sandbox's container ID, network namespace and
// CNI_ARGS.
type cniCall struct {
	command string
	sb      devkubelet.Sandbox
	netns   string // overrides sb.NetnsPath when set
}

// cniOutcome is what a plugin run answered.
type cniOutcome struct {
	code uint   // 0 on success, else the CNI error code
	msg  string // the error's message and details
	ip   string // ADD: the pod's address in the result
}

func (o cniOutcome) String() string {
	if o.code == 0 {
		if o.ip != "" {
			return "ok, IP " + o.ip
		}
		return "ok"
	}
	return fmt.Sprintf("code %d: %s", o.code, o.msg)
}

// runCNI runs the plugin in binDir with the plugin configuration of the
// sandbox's conflist. An error means the plugin did not answer as CNI
// requires (no error result on failure), or could not run.
func runCNI(ctx context.Context, binDir string, c cniCall) (cniOutcome, error) {
	conf, err := pluginConf(c.sb.ConfList)
	if err != nil {
		return cniOutcome{}, err
	}
	netns := c.sb.NetnsPath
	if c.netns != "" {
		netns = c.netns
	}
	ctx, cancel := context.WithTimeout(ctx, cniTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "cellium-cni"))
	cmd.Env = []string{
		"CNI_COMMAND=" + c.command,
		"CNI_CONTAINERID=" + c.sb.ID,
		"CNI_NETNS=" + netns,
		"CNI_IFNAME=" + c.sb.IfName,
		"CNI_PATH=" + binDir,
		"CNI_ARGS=" + fmt.Sprintf("IgnoreUnknown=1;K8S_POD_NAMESPACE=%s;K8S_POD_NAME=%s;K8S_POD_INFRA_CONTAINER_ID=%s;K8S_POD_UID=%s",
			c.sb.Namespace, c.sb.Name, c.sb.ID, c.sb.UID),
		"PATH=" + os.Getenv("PATH"),
	}
	cmd.Stdin = bytes.NewReader(conf)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	if runErr == nil {
		out := cniOutcome{}
		if c.command == "ADD" {
			var res types100.Result
			if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
				return out, fmt.Errorf("cellium-cni ADD succeeded with a result that does not parse: %w: %q", err, stdout.String())
			}
			for _, ip := range res.IPs {
				if ip.Address.IP.To4() != nil {
					out.ip = ip.Address.IP.String()
					break
				}
			}
		}
		return out, nil
	}
	var cniErr cnitypes.Error
	if err := json.Unmarshal(stdout.Bytes(), &cniErr); err != nil || cniErr.Code == 0 {
		return cniOutcome{}, fmt.Errorf("cellium-cni %s failed (%v) without a CNI error result: stdout %q, stderr %q",
			c.command, runErr, stdout.String(), lastBytes(stderr.String(), 2000))
	}
	msg := cniErr.Msg
	if cniErr.Details != "" {
		msg += ": " + cniErr.Details
	}
	return cniOutcome{code: cniErr.Code, msg: msg}, nil
}

// pluginConf turns a conflist into the configuration a runtime passes to
// its only plugin: the plugin's object with cniVersion and name.
func pluginConf(confList []byte) ([]byte, error) {
	var list struct {
		CNIVersion string           `json:"cniVersion"`
		Name       string           `json:"name"`
		Plugins    []map[string]any `json:"plugins"`
	}
	if err := json.Unmarshal(confList, &list); err != nil || len(list.Plugins) == 0 {
		return nil, fmt.Errorf("sandbox conflist %q: %v", confList, err)
	}
	conf := list.Plugins[0]
	conf["cniVersion"], conf["name"] = list.CNIVersion, list.Name
	return json.Marshal(conf)
}

func lastBytes(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}
