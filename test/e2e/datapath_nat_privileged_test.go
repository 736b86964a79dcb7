package e2e

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	api "github.com/cellium/cellium/api/policy"
	"github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/test/privileged"
)

// TestPrivilegedDatapathHostNAT: two pods of the agent's node, the
// same-node redirect on for both (their cil_lxc_policy slots set), the
// socket load balancer off; an nftables DNAT in the node's network
// namespace (a table of the test's own) maps a virtual address:port to
// the backend pod, as kube-proxy does for a NodePort, an ExternalIP or a
// ClusterIP, or the portmap plugin for a hostPort. TCP and UDP from the
// client pod to the virtual address get their answers: the backend's
// replies go back through the node's stack, which reverses the DNAT,
// instead of the redirect straight into the client (the backend's
// conntrack entry carries the via-stack flag). A CNP denying the client
// at the backend's ingress drops the translated flow, with the drop
// event of the backend's endpoint.
func TestPrivilegedDatapathHostNAT(t *testing.T) {
	e := newEnv(t, envOptions{hostRouting: true, bpf: true})
	blackhole(t, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(100 + cidrs.Load()), 0, 0}), 16))
	// The virtual address: in a range of this process's, blackholed in
	// the node, so that only the DNAT makes it reachable.
	x := byte(os.Getpid()%200) + 20
	blackhole(t, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 249, x, 0}), 24))
	vip := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 249, x, 10}), 30080)

	peers := e.dpPods([]string{"client", "backend"})
	client, backend := peers["client"], peers["backend"]
	bpfRoot := filepath.Join(e.node.AgentConfig().BPFRoot(), "cellium")
	eventually(t, 30*time.Second, "the same-node redirect on for both pods, client->backend passing", func() error {
		m, err := maps.Open(bpfRoot)
		if err != nil {
			return err
		}
		defer m.Close()
		for _, p := range []dpPeer{client, backend} {
			if has, err := m.PolicyProgs.Has(p.ep); err != nil || !has {
				return fmt.Errorf("pod %s: endpoint %d's cil_lxc_policy slot set %v (%v)", p.name, p.ep, has, err)
			}
		}
		for _, proto := range []string{"tcp", "udp"} {
			if ok, err := probe(client.netns, proto, backend.ip, time.Second); err != nil || !ok {
				return fmt.Errorf("client->backend/%s directly: no answer (%v)", proto, err)
			}
		}
		return nil
	})

	hostNS, err := ns.GetCurrentNS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = hostNS.Close() })
	privileged.DNAT(t, hostNS.Path(), fmt.Sprintf("cellium-e2e-hostnat-%d", os.Getpid()), vip,
		netip.AddrPortFrom(backend.ip, dpPort))

	for _, proto := range []string{"tcp", "udp"} {
		// A few flows each: every one a new connection through the DNAT.
		for i := range 3 {
			if ok, err := probePort(client.netns, proto, vip, 3*time.Second); err != nil || !ok {
				t.Errorf("client->%s/%s (DNAT to backend %s), flow %d: no answer (%v)", vip, proto, backend.ip, i, err)
			}
		}
	}
	// The backend's entries of the translated flows say they came through
	// the stack.
	m, err := maps.Open(bpfRoot)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	flagged := map[uint8]int{}
	if err := m.CT4.Iterate(func(k maps.CTKey, v maps.CTEntry) bool {
		if k.Src == client.ip && k.Dst == backend.ip && k.DstPort == dpPort && k.Dir == maps.CTIngress && v.Flags&maps.CTFlagViaStack != 0 {
			flagged[k.Proto]++
		}
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if flagged[6] == 0 || flagged[17] == 0 {
		t.Errorf("backend's conntrack entries from the client with flag via-stack: %d TCP, %d UDP; want some of each", flagged[6], flagged[17])
	}
	if t.Failed() {
		t.FailNow()
	}

	// The backend's ingress policy applies to the translated flow.
	drops := e.watchDrops()
	sel := func(app string) api.EndpointSelector {
		return api.EndpointSelector{MatchLabels: map[string]string{"app": app}}
	}
	_, err = e.cilium.CiliumV2().CiliumNetworkPolicies(e.ns).Create(e.ctx, &ciliumv2.CiliumNetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "backend-deny-client", Namespace: e.ns},
		Spec: &api.Rule{EndpointSelector: &api.EndpointSelector{MatchLabels: map[string]string{"app": "backend"}},
			Ingress:     []api.IngressRule{{IngressCommonRule: api.IngressCommonRule{FromEntities: api.EntitySlice{api.EntityAll}}}},
			IngressDeny: []api.IngressDenyRule{{IngressCommonRule: api.IngressCommonRule{FromEndpoints: []api.EndpointSelector{sel("client")}}}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	applied := time.Now()
	for _, proto := range []string{"tcp", "udp"} {
		eventually(t, 30*time.Second, "client->"+vip.String()+"/"+proto+" denied by the backend's policy", func() error {
			if ok, err := probePort(client.netns, proto, vip, 500*time.Millisecond); err != nil || ok {
				return fmt.Errorf("client->%s/%s still answered (%v)", vip, proto, err)
			}
			return nil
		})
		if _, ok := drops.wait(applied, 10*time.Second, policyDrop(backend.ep, dropPolicyDeny, client.ip, backend.ip, proto)); !ok {
			t.Errorf("client->%s/%s denied, but no \"Policy denied by denylist\" drop of %s->%s at the backend's endpoint %d",
				vip, proto, client.ip, backend.ip, backend.ep)
		}
	}
	if err := e.cilium.CiliumV2().CiliumNetworkPolicies(e.ns).Delete(e.ctx, "backend-deny-client", metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete the CNP: %v", err)
	}
	eventually(t, 30*time.Second, "client->"+vip.String()+" answered again without the deny", func() error {
		for _, proto := range []string{"tcp", "udp"} {
			if ok, err := probePort(client.netns, proto, vip, time.Second); err != nil || !ok {
				return fmt.Errorf("client->%s/%s: no answer (%v)", vip, proto, err)
			}
		}
		return nil
	})
}
