package realnode

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// NodePorts of the Services checkNodePorts creates.
const (
	nodePortCluster = 30181 // externalTrafficPolicy: Cluster
	nodePortLocal   = 30182 // externalTrafficPolicy: Local
)

// checkNodePorts checks NodePort Services the way a client outside the
// cluster sees them, whoever serves them (kube-proxy, or with kpr cellium's
// kube-proxy replacement with no kube-proxy anywhere). backend is a pod of
// space (label app=backend, serving the demo app on :8080) that runs on
// c.Nodes[0]; c.Nodes[1] has no pod of that app. Two Services select it:
//
//   - externalTrafficPolicy Cluster: this machine (outside the nodes, on
//     their bridge) reaches it at every node's address; through the node
//     without the backend the backend sees that node's address (SNAT);
//     a process on each node (in the node's network namespace and cgroup)
//     reaches it at its own node's address;
//   - externalTrafficPolicy Local: through the backend's node the backend
//     sees this machine's address (BridgeAddr: the client is kept);
//     through the other node nothing answers.
//
// With kpr, neither node has kube-proxy's nftables tables.
func checkNodePorts(t *testing.T, c *Cluster, space, backend string, kpr bool) {
	t.Helper()
	ctx := t.Context()
	cs := c.Control.Clientset()
	if kpr {
		for _, n := range c.Nodes {
			for _, tbl := range kubeProxyTables {
				fam, name, _ := strings.Cut(tbl, " ")
				out, err := n.Namespaces().Command(ctx, "nft", "list", "table", fam, name).CombinedOutput()
				if err == nil {
					t.Errorf("node %s has kube-proxy's table %s with kube-proxy replacement:\n%s", n.Name, tbl, out)
				}
			}
		}
	}
	for _, s := range []struct {
		name     string
		nodePort int32
		policy   corev1.ServiceExternalTrafficPolicy
	}{
		{"np-cluster", nodePortCluster, corev1.ServiceExternalTrafficPolicyCluster},
		{"np-local", nodePortLocal, corev1.ServiceExternalTrafficPolicyLocal},
	} {
		_, err := cs.CoreV1().Services(space).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: s.name},
			Spec: corev1.ServiceSpec{
				Type:                  corev1.ServiceTypeNodePort,
				Selector:              map[string]string{"app": backend},
				ExternalTrafficPolicy: s.policy,
				Ports: []corev1.ServicePort{{Name: "http", Port: 8080, TargetPort: intstr.FromInt32(8080),
					NodePort: s.nodePort}},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("service %s: %v", s.name, err)
		}
	}
	host, err := ns.GetCurrentNS()
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	withBackend, without := c.Nodes[0], c.Nodes[1]
	get := func(node *Node, port int, path string) (string, error) {
		return httpGetPathIn(host, node.IP.String()+":"+strconv.Itoa(port), path)
	}
	for _, n := range c.Nodes {
		eventually(t, time.Minute, fmt.Sprintf("this machine reaching NodePort %s:%d", n.IP, nodePortCluster), func() error {
			body, err := get(n, nodePortCluster, "/")
			if err != nil {
				return err
			}
			if body != "hello from "+backend+"\n" {
				return fmt.Errorf("answer %q", body)
			}
			return nil
		})
	}
	// Through the node without the backend: SNAT to that node.
	eventually(t, 30*time.Second, "the client address through "+without.Name, func() error {
		body, err := get(without, nodePortCluster, "/clientip")
		if err != nil {
			return err
		}
		if got := strings.TrimSpace(body); got != without.IP.String() {
			return fmt.Errorf("the backend saw %s, want the node's address %s (externalTrafficPolicy Cluster, remote backend)", got, without.IP)
		}
		return nil
	})
	// From a process of each node (its network namespace and cgroup: the
	// socket load balancer's or kube-proxy's output chain).
	for _, n := range c.Nodes {
		eventually(t, 30*time.Second, fmt.Sprintf("node %s reaching its own NodePort", n.Name), func() error {
			body, err := curlOnNode(ctx, n, fmt.Sprintf("http://%s:%d/", n.IP, nodePortCluster))
			if err != nil {
				return err
			}
			if body != "hello from "+backend+"\n" {
				return fmt.Errorf("answer %q", body)
			}
			return nil
		})
	}
	// externalTrafficPolicy Local: the client is kept; the node without
	// a local backend does not answer.
	eventually(t, 30*time.Second, "the client address through "+withBackend.Name+" (Local)", func() error {
		body, err := get(withBackend, nodePortLocal, "/clientip")
		if err != nil {
			return err
		}
		if got := strings.TrimSpace(body); got != BridgeAddr.String() {
			return fmt.Errorf("the backend saw %s, want this machine's %s (externalTrafficPolicy Local keeps the client)", got, BridgeAddr)
		}
		return nil
	})
	for range 3 {
		if body, err := get(without, nodePortLocal, "/"); err == nil {
			t.Fatalf("node %s answered NodePort %d (externalTrafficPolicy Local, no local backend): %q", without.Name, nodePortLocal, body)
		}
	}
	served := "kube-proxy"
	if kpr {
		served = "cellium's kube-proxy replacement (no kube-proxy tables on either node)"
	}
	t.Logf("NodePorts served by %s: Cluster from this machine through both nodes and from each node, SNAT to %s through it; Local keeps the client %s, nothing answers through %s",
		served, without.IP, BridgeAddr, without.Name)
}

// curlOnNode runs curl for url as a process of node n: in its network and
// mount namespaces and in its cgroup subtree, where the node's socket
// programs apply, and returns the body.
func curlOnNode(ctx context.Context, n *Node, url string) (string, error) {
	procs := n.CgroupProcs()
	script := `echo $$ > "$1" && exec curl -sS --fail -m 3 "$2"`
	cmd := exec.CommandContext(ctx, "sh", "-c", script, "sh", procs, url)
	out, err := exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + n.Namespaces().NetnsPath(), "--"}, cmd.Args...)...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("curl %s on node %s: %w: %s", url, n.Name, err, out)
	}
	return string(out), nil
}
