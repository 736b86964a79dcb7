package plugin

import (
	"bytes"
	"encoding/json"
	"net"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/version"

	"github.com/cellium/cellium/datapath/link"
)

func sampleLinkResult() link.Result {
	mac := func(s string) net.HardwareAddr { m, _ := net.ParseMAC(s); return m }
	gw := net.IPv4(10, 210, 0, 1).To4()
	return link.Result{
		HostIfName: "lxc0123456789ab", HostIfIndex: 17, HostMAC: mac("02:00:00:00:00:01"),
		PodIfName: "eth0", PodIfIndex: 2, PodMAC: mac("02:00:00:00:00:02"),
		NetnsPath: "/var/run/netns/pod", MTU: 1450,
		IPv4:    net.IPNet{IP: net.IPv4(10, 210, 0, 7).To4(), Mask: net.CIDRMask(32, 32)},
		Gateway: gw,
		Routes: []link.Route{
			{Dst: net.IPNet{IP: gw, Mask: net.CIDRMask(32, 32)}},
			{Dst: net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}, Via: gw},
		},
	}
}

// TestResultPerVersion pins the JSON of ADD's result in every supported
// version: 1.1.0 has the interfaces' MTU and the routes' scope, older
// versions only what their specification defines (0.3.x/0.4.0 add the
// address version).
func TestResultPerVersion(t *testing.T) {
	// 0.x results keep the struct's key order; 1.x results are written
	// through a map, so their keys are sorted and an empty dns is left out.
	const (
		ifaces04 = `"interfaces":[{"name":"lxc0123456789ab","mac":"02:00:00:00:00:01"},{"name":"eth0","mac":"02:00:00:00:00:02","sandbox":"/var/run/netns/pod"}]`
		ips04    = `"ips":[{"version":"4","interface":1,"address":"10.210.0.7/32","gateway":"10.210.0.1"}]`
		routes   = `"routes":[{"dst":"10.210.0.1/32"},{"dst":"0.0.0.0/0","gw":"10.210.0.1"}]`
		ifaces10 = `"interfaces":[{"mac":"02:00:00:00:00:01","name":"lxc0123456789ab"},{"mac":"02:00:00:00:00:02","name":"eth0","sandbox":"/var/run/netns/pod"}]`
		ifaces11 = `"interfaces":[{"mac":"02:00:00:00:00:01","mtu":1450,"name":"lxc0123456789ab"},{"mac":"02:00:00:00:00:02","mtu":1450,"name":"eth0","sandbox":"/var/run/netns/pod"}]`
		ips10    = `"ips":[{"address":"10.210.0.7/32","gateway":"10.210.0.1","interface":1}]`
		routes11 = `"routes":[{"dst":"10.210.0.1/32","scope":253},{"dst":"0.0.0.0/0","gw":"10.210.0.1"}]`
	)
	want := map[string]string{
		"0.3.1": `{"cniVersion":"0.3.1",` + ifaces04 + `,` + ips04 + `,` + routes + `,"dns":{}}`,
		"0.4.0": `{"cniVersion":"0.4.0",` + ifaces04 + `,` + ips04 + `,` + routes + `,"dns":{}}`,
		"1.0.0": `{"cniVersion":"1.0.0",` + ifaces10 + `,` + ips10 + `,` + routes + `}`,
		"1.1.0": `{"cniVersion":"1.1.0",` + ifaces11 + `,` + ips10 + `,` + routes11 + `}`,
	}
	for _, v := range SupportedVersions().SupportedVersions() {
		t.Run(v, func(t *testing.T) {
			var buf bytes.Buffer
			if err := printResult(&buf, newResult(sampleLinkResult()), v); err != nil {
				t.Fatal(err)
			}
			var compact bytes.Buffer
			if err := json.Compact(&compact, buf.Bytes()); err != nil {
				t.Fatal(err)
			}
			if got := compact.String(); got != want[v] {
				t.Fatalf("result\n got %s\nwant %s", got, want[v])
			}

			// CHECK reads the same result back as its prevResult.
			prev, err := version.NewResult(v, buf.Bytes())
			if err != nil {
				t.Fatal(err)
			}
			att, err := findAttachment(prev, "eth0", "/var/run/netns/pod")
			if err != nil {
				t.Fatal(err)
			}
			wantMTU := 0
			if v == "1.1.0" {
				wantMTU = 1450
			}
			if att.ip.String() != "10.210.0.7" || att.gateway.String() != "10.210.0.1" ||
				att.podMAC.String() != "02:00:00:00:00:02" || att.mtu != wantMTU {
				t.Fatalf("attachment %+v", att)
			}
		})
	}
}

func TestFindAttachmentErrors(t *testing.T) {
	var buf bytes.Buffer
	if err := printResult(&buf, newResult(sampleLinkResult()), "1.0.0"); err != nil {
		t.Fatal(err)
	}
	prev, err := version.NewResult("1.0.0", buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ ifName, netns, want string }{
		{"eth1", "/var/run/netns/pod", "no interface eth1"},
		{"eth0", "/var/run/netns/other", "no interface eth0 in sandbox /var/run/netns/other"},
	} {
		if _, err := findAttachment(prev, tc.ifName, tc.netns); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("findAttachment(%s, %s) = %v, want %q", tc.ifName, tc.netns, err, tc.want)
		}
	}
	noIP := strings.Replace(buf.String(), `"interface": 1`, `"interface": 0`, 1)
	prev, err = version.NewResult("1.0.0", []byte(noIP))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := findAttachment(prev, "eth0", "/var/run/netns/pod"); err == nil || !strings.Contains(err.Error(), "no IPv4 address") {
		t.Errorf("address on the host interface: %v", err)
	}
}
