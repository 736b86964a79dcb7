package scale

import (
	"fmt"
	"net/netip"
	"strconv"
	"sync"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/statedb/labels"
)

// The shape of the simulated cluster.
const (
	// namespaces is how many namespaces the identities, pods, Services
	// and NetworkPolicies are spread over.
	namespaces = 10
	// groups is how many values the scale-group label takes: a policy
	// that selects one group selects a tenth of the identities.
	groups = 10
	// firstIdentity is the number of the first simulated identity; the
	// agent allocates its own (the local pod's) elsewhere in 256-65535.
	firstIdentity = 10000
	// maxIdentities keeps the simulated identities below 65536, cluster
	// 0's range.
	maxIdentities = 65535 - firstIdentity
	// maxNodes is how many /24 pod CIDRs fit in 10.1.0.0/16 to
	// 10.254.255.0/24.
	maxNodes = 254 * 256
	// podsPerIdentity is how many remote pods share an identity (as the
	// replicas of a Deployment do); the other identities have no pod.
	podsPerIdentity = 10
	// groupLabel is the label that policies select identities by.
	groupLabel = "scale-group"
	// localNamespace and localApp are the local pod's namespace and app
	// label: the subject of the measured policy.
	localNamespace = "scale-local"
	localApp       = "scale-local"
)

// nsName is the i-th namespace.
func nsName(i int) string { return "scale-" + strconv.Itoa(i%namespaces) }

// groupOf is identity i's group.
func groupOf(i int) string { return "g" + strconv.Itoa(i%groups) }

// identityID is the numeric identity of the i-th simulated identity.
func identityID(i int) int64 { return int64(firstIdentity + i) }

// identityNamespace is the namespace of the i-th identity (and of every
// pod with it).
func identityNamespace(i int) string { return nsName(i) }

// ciliumIdentity is the i-th identity, as the agents' allocator would
// have written it for a pod of app-<i> in its namespace.
func ciliumIdentity(i int) *ciliumv2.CiliumIdentity {
	ns := identityNamespace(i)
	return &ciliumv2.CiliumIdentity{
		ObjectMeta: metav1.ObjectMeta{Name: strconv.FormatInt(identityID(i), 10),
			Labels: map[string]string{"io.kubernetes.pod.namespace": ns}},
		SecurityLabels: identityLabels(i),
	}
}

func identityLabels(i int) map[string]string {
	// As the agents derive them from a pod and its namespace.
	ns := identityNamespace(i)
	return map[string]string{
		"k8s:" + labels.PodNamespaceLabel:                                       ns,
		"k8s:" + labels.PodNamespaceMetaLabels + ".kubernetes.io/metadata.name": ns,
		"k8s:" + labels.PolicyLabelCluster:                                      "default",
		"k8s:" + labels.PolicyLabelServiceAccount:                               "default",
		"k8s:app":           "app-" + strconv.Itoa(i),
		"k8s:" + groupLabel: groupOf(i),
	}
}

// nodeName, nodeIP and podCIDR describe the n-th remote node.
func nodeName(n int) string { return fmt.Sprintf("scale-node-%05d", n) }

func nodeIP(n int) netip.Addr {
	base := netip.MustParseAddr("100.64.0.0").As4()
	v := uint32(base[0])<<24 | uint32(base[1])<<16 | uint32(n+1)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

func podCIDR(n int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(1 + n/256), byte(n % 256), 0}), 24)
}

// ciliumNode is the n-th remote node as its agent and the operator's
// cluster-pool IPAM would have left it: its addresses and pod CIDR.
func ciliumNode(n int) *ciliumv2.CiliumNode {
	return &ciliumv2.CiliumNode{
		ObjectMeta: metav1.ObjectMeta{Name: nodeName(n)},
		Spec: ciliumv2.NodeSpec{
			Addresses: []ciliumv2.NodeAddress{{Type: ciliumv2.NodeInternalIP, IP: nodeIP(n).String()}},
			IPAM:      ciliumv2.IPAMSpec{PodCIDRs: []string{podCIDR(n).String()}},
		},
	}
}

// addressPool hands out the pod addresses of every remote node: each
// node's addresses in turn, a freed one last, so that an address comes
// back only after all others of its node.
type addressPool struct {
	mu   sync.Mutex
	free [][]uint8 // per node, host parts in hand-out order
}

func newAddressPool(nodes int) *addressPool {
	p := &addressPool{free: make([][]uint8, nodes)}
	for n := range p.free {
		for h := 1; h <= 254; h++ {
			p.free[n] = append(p.free[n], uint8(h))
		}
	}
	return p
}

// get returns a free address of node n.
func (p *addressPool) get(n int) (netip.Addr, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.free[n]) == 0 {
		return netip.Addr{}, fmt.Errorf("node %s has no free pod address", nodeName(n))
	}
	h := p.free[n][0]
	p.free[n] = p.free[n][1:]
	b := podCIDR(n).Addr().As4()
	b[3] = h
	return netip.AddrFrom4(b), nil
}

// put frees an address of node n.
func (p *addressPool) put(n int, a netip.Addr) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.free[n] = append(p.free[n], a.As4()[3])
}

// remotePod is one simulated pod of another node: what its CiliumEndpoint
// says.
type remotePod struct {
	name     string
	node     int
	identity int // index of its identity
	ip       netip.Addr
}

// endpointID is the pod's endpoint ID on its node (its CiliumEndpoint's
// status.id, its ipcache key's Metadata).
func (p remotePod) endpointID() uint16 { return uint16(1 + int(p.ip.As4()[3])) }

// namespace is the pod's namespace (its identity's).
func (p remotePod) namespace() string { return identityNamespace(p.identity) }

// ciliumEndpoint is the CiliumEndpoint the pod's agent would write.
func (p remotePod) ciliumEndpoint() *ciliumv2.CiliumEndpoint {
	var labels []string
	for k, v := range identityLabels(p.identity) {
		labels = append(labels, k+"="+v)
	}
	return &ciliumv2.CiliumEndpoint{
		ObjectMeta: metav1.ObjectMeta{Name: p.name, Namespace: p.namespace()},
		Status: ciliumv2.EndpointStatus{
			ID:       int64(p.endpointID()),
			Identity: &ciliumv2.EndpointIdentity{ID: identityID(p.identity), Labels: labels},
			Networking: &ciliumv2.EndpointNetworking{
				Addressing: ciliumv2.AddressPairList{{IPV4: p.ip.String()}},
				NodeIP:     nodeIP(p.node).String(),
			},
			State: ciliumv2.EndpointStateReady,
		},
	}
}

// service is the s-th Service, selecting app-<s> pods in its namespace,
// and its EndpointSlice with the addresses of up to three pods.
func service(s int, backends []remotePod) (*corev1.Service, *discoveryv1.EndpointSlice) {
	ns := nsName(s)
	name := "svc-" + strconv.Itoa(s)
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "app-" + strconv.Itoa(s)},
			Ports:    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}},
		},
	}
	port, proto, portName := int32(8080), corev1.ProtocolTCP, "http"
	ready := true
	eps := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-1", Namespace: ns,
			Labels: map[string]string{discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: "scale.cellium.io"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &portName, Port: &port, Protocol: &proto}},
	}
	for _, b := range backends {
		node := nodeName(b.node)
		eps.Endpoints = append(eps.Endpoints, discoveryv1.Endpoint{Addresses: []string{b.ip.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready}, NodeName: &node})
	}
	return svc, eps
}

// networkPolicy is the p-th NetworkPolicy: app-<p> pods accept port 8080
// from the pods of one group in any namespace.
func networkPolicy(p int) *networkingv1.NetworkPolicy {
	port := intstr.FromInt32(8080)
	proto := corev1.ProtocolTCP
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "np-" + strconv.Itoa(p), Namespace: nsName(p)},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "app-" + strconv.Itoa(p)}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{{
					NamespaceSelector: &metav1.LabelSelector{},
					PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{groupLabel: groupOf(p)}},
				}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &proto, Port: &port}},
			}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
		},
	}
}
