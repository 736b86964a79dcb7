package hostlinks_test

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"

	"github.com/cellium/cellium/cells/doctor"
	"github.com/cellium/cellium/daemon/hostlinks"
	"github.com/cellium/cellium/datapath/link"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/test/privileged"
)

func newNS(t *testing.T) ns.NetNS {
	t.Helper()
	n, err := testutils.NewNS()
	if err != nil {
		t.Fatalf("create netns: %v", err)
	}
	t.Cleanup(func() {
		_ = n.Close()
		if err := testutils.UnmountNS(n); err != nil {
			t.Errorf("remove netns %s: %v", n.Path(), err)
		}
	})
	return n
}

// TestPrivilegedDoctorFindsOrphanVeth makes two real pod veths in a
// namespace that plays the node, gives one an endpoint, and expects the
// doctor to name the other as an orphan through the real link listing;
// once it is removed the node is clean.
func TestPrivilegedDoctorFindsOrphanVeth(t *testing.T) {
	privileged.Require(t)
	node := newNS(t)
	host := link.Host{NetnsPath: node.Path()}
	ctx := context.Background()
	setup := func(cid string, ip string) link.Result {
		pod := newNS(t)
		res, err := host.SetupEndpoint(ctx, link.Spec{ContainerID: cid, NetnsPath: pod.Path(),
			IPv4: net.ParseIP(ip), Gateway: net.ParseIP("10.231.0.1")})
		if err != nil {
			t.Fatalf("set up %s: %v", cid, err)
		}
		t.Cleanup(func() { _ = host.RemoveEndpoint(ctx, res.HostIfName, pod.Path()) })
		return res
	}
	kept := setup("cprocess-kept", "10.231.0.5")
	orphan := setup("cprocess-orphan", "10.231.0.6")

	lister := hostlinks.Lister{Host: host}
	check := func() []string {
		links, err := lister.ListHostLinks()
		if err != nil {
			t.Fatal(err)
		}
		f := &doctor.Facts{
			Endpoints: []*endpoints.Endpoint{{ID: 1, ContainerID: "cprocess-kept", HostIfName: kept.HostIfName,
				IPv4: netip.MustParseAddr("10.231.0.5"), CEPNamespace: "default", CEPName: "kept"}},
			Links: links, LinksKnown: true,
		}
		var out []string
		for _, fd := range doctor.Check(f) {
			out = append(out, fd.Kind+" "+fd.Object+": "+fd.Message)
		}
		return out
	}
	got := check()
	if len(got) != 1 || !strings.HasPrefix(got[0], "orphan-veth "+orphan.HostIfName+": ") || !strings.Contains(got[0], "cprocess-orphan") {
		t.Fatalf("findings %q: want one orphan-veth %s naming container cprocess-orphan", got, orphan.HostIfName)
	}
	if err := host.RemoveEndpoint(ctx, orphan.HostIfName, ""); err != nil {
		t.Fatal(err)
	}
	if got := check(); len(got) != 0 {
		t.Errorf("after removing the orphan: %q", got)
	}
}
