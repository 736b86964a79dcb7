package hostrouting_test

import (
	"bytes"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/cellium/cellium/daemon"
	"github.com/cellium/cellium/daemon/hostlinks"
	"github.com/cellium/cellium/daemon/hostrouting"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	var out bytes.Buffer
	cmd := daemon.NewCommand(daemon.Agent, hostlinks.Cell, hostrouting.Cell)
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

// The agent's whole graph with the host-routing cell builds (as
// cellium-agent composes it), shows the flag on by default and its tables
// and jobs.
func TestAgentGraphWithHostRouting(t *testing.T) {
	out, err := run(t, "hive")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"host-routing (Host device, routes to endpoints and forwarding sysctls)",
		"--enable-endpoint-routes=true (default true)",
		"--enable-ipv4-masquerade=true (default true)",
		"⇦ statedb.Table[*routes.Masquerade]",
		"⇦ statedb.Table[*routes.Route]",
		"⇦ statedb.Table[*routes.Device]",
		"⇦ statedb.Table[*routes.Sysctl]",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("agent hive output lacks %q", want)
		}
	}
}

// With the flag off nothing of the cell is built, and the graph still does.
func TestAgentGraphWithoutHostRouting(t *testing.T) {
	out, err := run(t, "hive", "--enable-endpoint-routes=false")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "--enable-endpoint-routes=false (default true): disabled: the cells below are not in the graph") {
		t.Errorf("the host-routing cell is not shown disabled with --enable-endpoint-routes=false:\n%s", out)
	}
}

// The routing-mode flags: Cilium's defaults, and bad combinations refused
// with what to do.
func TestRoutingModeFlags(t *testing.T) {
	def := hostrouting.DefaultConfig
	if def.RoutingMode != "tunnel" || def.TunnelProtocol != "vxlan" || def.TunnelPort != 8472 || def.AutoDirectNodeRoutes {
		t.Errorf("defaults = %+v, want tunnel, vxlan, 8472, no direct routes", def)
	}
	if err := def.Validate(); err != nil {
		t.Errorf("defaults invalid: %v", err)
	}
	for _, c := range []struct {
		mod  func(*hostrouting.Config)
		want string
	}{
		{func(c *hostrouting.Config) { c.TunnelProtocol = "geneve" }, "vxlan only"},
		{func(c *hostrouting.Config) { c.RoutingMode = "bgp" }, "tunnel and native"},
		{func(c *hostrouting.Config) { c.TunnelPort = 0 }, "--tunnel-port"},
		{func(c *hostrouting.Config) { c.RoutingMode = "native" }, "needs --ipv4-native-routing-cidr"},
		{func(c *hostrouting.Config) { c.IPv4NativeRoutingCIDR = "10.0.0.0" }, "must be an IPv4 CIDR"},
	} {
		cfg := def
		c.mod(&cfg)
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want one saying %q", cfg, err, c.want)
		}
	}
	native := def
	native.RoutingMode, native.IPv4NativeRoutingCIDR = "native", "10.0.0.0/8"
	if err := native.Validate(); err != nil {
		t.Errorf("native with a CIDR: %v", err)
	}
	native.IPv4NativeRoutingCIDR, native.EnableIPv4Masquerade = "", false
	if err := native.Validate(); err != nil {
		t.Errorf("native without masquerading needs no CIDR: %v", err)
	}
}
