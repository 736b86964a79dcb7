package harness

import (
	"crypto/tls"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/cellium/cellium/test/privileged"
)

// TestPrivilegedBindAddress: with BindAddress (a bridge's address, as the
// several-node cluster of test/realnode uses) the API server listens there
// and nowhere else (not on 127.0.0.1), advertises it as the kubernetes
// Service's endpoint, its certificate names it (a client verifying the
// CA connects), and the kubeconfigs point at it.
func TestPrivilegedBindAddress(t *testing.T) {
	privileged.Require(t)
	addr := netip.MustParseAddr("10.250.0.253")
	la := netlink.NewLinkAttrs()
	la.Name = "crnbrapi"
	br := &netlink.Bridge{LinkAttrs: la}
	if err := netlink.LinkAdd(br); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netlink.LinkDel(br) })
	if err := netlink.AddrAdd(br, &netlink.Addr{IPNet: &net.IPNet{IP: addr.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(br); err != nil {
		t.Fatal(err)
	}
	verifyNoLeaks(t)
	ctx := t.Context()
	c := ForTest(t, Options{BindAddress: addr, ServiceClusterIPRange: "10.250.1.0/24"})
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig())
	if err != nil {
		t.Fatal(err)
	}
	host, port, err := net.SplitHostPort(cfg.Host[len("https://"):])
	if err != nil || host != addr.String() {
		t.Fatalf("kubeconfig server %s, want %s", cfg.Host, addr)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The certificate is verified against the CA: its SANs name addr.
	if _, err := cs.CoreV1().Namespaces().Get(ctx, "kube-system", metav1.GetOptions{}); err != nil {
		t.Fatalf("through the kubeconfig at %s: %v", cfg.Host, err)
	}
	// The API server's endpoint reconciler writes it shortly after start.
	deadline := time.Now().Add(30 * time.Second)
	for {
		sl, err := c.Clientset().DiscoveryV1().EndpointSlices("default").Get(ctx, "kubernetes", metav1.GetOptions{})
		if err == nil && len(sl.Endpoints) == 1 && len(sl.Endpoints[0].Addresses) == 1 && sl.Endpoints[0].Addresses[0] == addr.String() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the kubernetes Service's EndpointSlice: %+v, %v; want the endpoint %s", sl, err, addr)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Nothing on loopback.
	conn, err := tls.Dial("tcp", net.JoinHostPort("127.0.0.1", port), &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // only whether it listens
	if err == nil {
		conn.Close()
		t.Errorf("the API server answers on 127.0.0.1:%s too", port)
	}
}
