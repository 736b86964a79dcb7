package soak

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/datapath/link"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/test/devkubelet"
)

// Snapshot is everything the invariants compare, read from the API
// server, the agent and the node at about the same time. A snapshot taken
// while something is in flight may disagree with itself; [Check] is
// called again until it agrees or the deadline passes.
type Snapshot struct {
	// Namespace is the soak's namespace: its pods and CEPs are listed.
	Namespace string
	// Pods are the pods of Namespace.
	Pods []Pod
	// CEPs are the CiliumEndpoints of Namespace.
	CEPs []CEP
	// Endpoints are all of the agent's endpoints (GET /v1/endpoint).
	Endpoints []models.Endpoint
	// IPAM is every allocated address (GET /v1/ipam).
	IPAM []models.IPAMAddress
	// Allocations are the agent's identity references (the
	// identity-allocations table); nil when the agent has no such table.
	Allocations []Allocation
	// Identities are the names of the CiliumIdentity objects.
	Identities map[string]bool
	// Sandboxes are the devkubelet's sandbox records.
	Sandboxes []devkubelet.Sandbox
	// PodLinks are the interfaces inside each sandbox's network
	// namespace (lo excluded), by sandbox ID; a sandbox whose namespace
	// cannot be entered has no entry.
	PodLinks map[string][]PodLink
	// Netns are the names of the pinned network namespaces that belong to
	// the soak (see Expect.NetnsPrefixes).
	Netns []string
	// HostLinks are the host's endpoint links (lxc*).
	HostLinks []link.HostLink
	// StateFiles are the names of the files in the agent's endpoint state
	// directory.
	StateFiles []string
	// IPAMStateFile are the addresses of the agent's IPAM state file; nil
	// when the file could not be read.
	IPAMStateFile []string
	// Datapath is the agent's pinned eBPF state and the tables it comes
	// from; nil when the agent runs without the eBPF datapath (the
	// datapath invariants are then skipped).
	Datapath *Datapath
}

// Pod is what the checks need of a pod.
type Pod struct {
	Name, UID, IP string
	Running       bool
	Deleting      bool
}

// CEP is what the checks need of a CiliumEndpoint.
type CEP struct {
	Name, UID string
	// OwnerUIDs are the UIDs of its Pod owner references.
	OwnerUIDs []string
	IP        string
	State     string
	Identity  int64
	ID        int64
}

// Allocation is one row of the agent's identity-allocations table.
type Allocation struct {
	ID   int64 `json:"id"`
	Refs int   `json:"refs"`
}

// PodLink is an interface inside a pod's network namespace.
type PodLink struct {
	Name  string
	Addrs []string // IPv4 addresses
}

// Expect is what the soak knows it asked for.
type Expect struct {
	// Alive are the names of the pods that must exist and run.
	Alive map[string]bool
	// ContainerPrefix starts every container (sandbox) ID the soak's
	// kubelet makes (devkubelet.Config.SandboxIDPrefix): a host link
	// labelled with such an ID that no live sandbox owns is a leak. Links
	// of other IDs belong to other tests on the machine.
	ContainerPrefix string
	// NetnsPrefixes start the names of the network namespaces the soak
	// and its kubelet make.
	NetnsPrefixes []string
}

// Violation is one broken invariant.
type Violation struct {
	// Invariant names the rule, e.g. "ipam-leak".
	Invariant string
	// Object is what it is about ("pod p-3", "ip 10.1.0.7").
	Object string
	// Message says what is wrong.
	Message string
}

func (v Violation) String() string {
	return fmt.Sprintf("%s: %s: %s", v.Invariant, v.Object, v.Message)
}

type checker struct {
	out []Violation
}

func (c *checker) addf(inv, obj, format string, args ...any) {
	c.out = append(c.out, Violation{Invariant: inv, Object: obj, Message: fmt.Sprintf(format, args...)})
}

// Checks is how many invariants Check evaluates per call (for the
// report's count), DatapathChecks more with a datapath snapshot.
const Checks = 9

// Check compares a snapshot with what the soak expects and returns every
// violated invariant, sorted:
//
//  1. pods: every pod the soak keeps runs with an IP; every other pod is
//     gone;
//  2. CEPs: every live pod has exactly one CEP, owned by its UID, with its
//     IP, ready, with an identity and an endpoint ID; no CEP without a
//     live pod; no two CEPs with one IP;
//  3. endpoints: every live pod has exactly one endpoint, with its UID,
//     its IP, its sandbox's container ID, ready, with the CEP's identity
//     and ID; one health endpoint; nothing else;
//  4. IPAM: allocations = endpoint addresses + the router's; each with
//     the right owner; the state file holds the same;
//  5. identities: each allocation's references = endpoints using it;
//     every identity in use has an allocation and a CiliumIdentity;
//  6. sandboxes: one ready sandbox per live pod with its IP, none else;
//  7. netns: the soak's network namespaces are exactly the sandboxes';
//     each holds eth0 with the pod's IP;
//  8. veths: every sandbox and endpoint has its host link; no host link
//     of the soak's containers without a live sandbox;
//  9. state files: one per endpoint, nothing else;
//  10. datapath (when Snapshot.Datapath is set): see checkDatapath.
func Check(s *Snapshot, e *Expect) []Violation {
	c := &checker{}
	pods := map[string]Pod{}
	for _, p := range s.Pods {
		pods[p.Name] = p
	}
	live := map[string]Pod{} // alive and expected so
	for name := range e.Alive {
		p, ok := pods[name]
		switch {
		case !ok:
			c.addf("pod-missing", "pod "+name, "the pod the soak created is gone")
		case p.Deleting:
			c.addf("pod-terminating", "pod "+name, "the pod is terminating but the soak did not delete it")
		case !p.Running || p.IP == "":
			c.addf("pod-not-running", "pod "+name, "not Running with an IP (running %v, IP %q)", p.Running, p.IP)
		default:
			live[name] = p
		}
	}
	for _, p := range s.Pods {
		if !e.Alive[p.Name] {
			c.addf("pod-not-gone", "pod "+p.Name, "deleted by the soak but still there (UID %s, terminating %v): the kubelet did not finish its teardown", p.UID, p.Deleting)
		}
	}
	sandboxes := c.checkSandboxes(s, e, live)
	c.checkCEPs(s, live)
	endpointIPs := c.checkEndpoints(s, live, sandboxes)
	c.checkIPAM(s, live, endpointIPs)
	c.checkIdentities(s)
	c.checkNetns(s, e, live, sandboxes)
	c.checkLinks(s, e, sandboxes)
	c.checkStateFiles(s)
	c.checkDatapath(s, live)
	slices.SortFunc(c.out, func(a, b Violation) int { return strings.Compare(a.String(), b.String()) })
	return slices.Compact(c.out)
}

// checkSandboxes returns the sandbox of each live pod.
func (c *checker) checkSandboxes(s *Snapshot, e *Expect, live map[string]Pod) map[string]devkubelet.Sandbox {
	byPod := map[string][]devkubelet.Sandbox{}
	for _, sb := range s.Sandboxes {
		if sb.Namespace != s.Namespace {
			c.addf("sandbox-stale", "sandbox "+shortID(sb.ID), "belongs to %s/%s, not to the soak's namespace", sb.Namespace, sb.Name)
			continue
		}
		byPod[sb.Name] = append(byPod[sb.Name], sb)
	}
	out := map[string]devkubelet.Sandbox{}
	for name, p := range live {
		sbs := byPod[name]
		if len(sbs) != 1 {
			c.addf("sandbox-count", "pod "+name, "%d sandboxes, want 1", len(sbs))
			continue
		}
		sb := sbs[0]
		switch {
		case string(sb.UID) != p.UID:
			c.addf("sandbox-uid", "pod "+name, "sandbox %s is for UID %s, the pod is %s", shortID(sb.ID), sb.UID, p.UID)
		case sb.State != devkubelet.SandboxReady:
			c.addf("sandbox-not-ready", "pod "+name, "sandbox %s is %s", shortID(sb.ID), sb.State)
		case sb.IP != p.IP:
			c.addf("sandbox-ip", "pod "+name, "sandbox %s has IP %s, the pod's status says %s", shortID(sb.ID), sb.IP, p.IP)
		}
		out[name] = sb
	}
	for name, sbs := range byPod {
		if _, ok := live[name]; !ok && !e.Alive[name] {
			for _, sb := range sbs {
				c.addf("sandbox-stale", "sandbox "+shortID(sb.ID), "of deleted pod %s still recorded (state %s)", name, sb.State)
			}
		}
	}
	return out
}

func (c *checker) checkCEPs(s *Snapshot, live map[string]Pod) {
	byIP := map[string][]string{}
	for _, cep := range s.CEPs {
		if cep.IP != "" {
			byIP[cep.IP] = append(byIP[cep.IP], cep.Name)
		}
		p, ok := live[cep.Name]
		if !ok {
			c.addf("cep-stale", "cep "+cep.Name, "no live pod of that name (owners %v, IP %s)", cep.OwnerUIDs, cep.IP)
			continue
		}
		switch {
		case len(cep.OwnerUIDs) != 1 || cep.OwnerUIDs[0] != p.UID:
			c.addf("cep-owner", "cep "+cep.Name, "owned by %v, the pod is %s", cep.OwnerUIDs, p.UID)
		case cep.IP != p.IP:
			c.addf("cep-ip", "cep "+cep.Name, "IP %q, the pod's is %s", cep.IP, p.IP)
		case cep.State != string(ciliumv2.EndpointStateReady):
			c.addf("cep-not-ready", "cep "+cep.Name, "state %q", cep.State)
		case cep.Identity == 0:
			c.addf("cep-identity", "cep "+cep.Name, "no identity")
		case cep.ID == 0:
			c.addf("cep-id", "cep "+cep.Name, "no endpoint ID")
		}
	}
	have := map[string]bool{}
	for _, cep := range s.CEPs {
		have[cep.Name] = true
	}
	for name := range live {
		if !have[name] {
			c.addf("cep-missing", "pod "+name, "no CiliumEndpoint")
		}
	}
	for ip, names := range byIP {
		if len(names) > 1 {
			slices.Sort(names)
			c.addf("cep-ip-shared", "ip "+ip, "on several CEPs: %v", names)
		}
	}
}

// endpointIP is the endpoint's IPv4 address.
func endpointIP(ep *models.Endpoint) string {
	if n := ep.Status.Networking; n != nil && len(n.Addressing) > 0 && n.Addressing[0] != nil && n.Addressing[0].IPV4 != "" {
		return n.Addressing[0].IPV4
	}
	if ep.Spec != nil {
		return ep.Spec.Addressing.IPV4
	}
	return ""
}

func endpointIdentity(ep *models.Endpoint) int64 {
	if ep.Status.Identity == nil {
		return 0
	}
	return ep.Status.Identity.ID
}

func isPodEndpoint(ep *models.Endpoint) bool {
	return ep.Spec != nil && ep.Spec.K8sPodName != ""
}

// checkEndpoints returns the IPs of the endpoints, each with who has it.
func (c *checker) checkEndpoints(s *Snapshot, live map[string]Pod, sandboxes map[string]devkubelet.Sandbox) map[string][]string {
	ips := map[string][]string{}
	byPod := map[string][]models.Endpoint{}
	health := 0
	ceps := map[string]CEP{}
	for _, cep := range s.CEPs {
		ceps[cep.Name] = cep
	}
	for _, ep := range s.Endpoints {
		who := "endpoint " + strconv.FormatInt(ep.ID, 10)
		if ip := endpointIP(&ep); ip != "" {
			ips[ip] = append(ips[ip], who)
		}
		if !isPodEndpoint(&ep) {
			health++
			continue
		}
		if ep.Spec.K8sNamespace != s.Namespace {
			c.addf("endpoint-stale", who, "for pod %s/%s, which is not on this node", ep.Spec.K8sNamespace, ep.Spec.K8sPodName)
			continue
		}
		byPod[ep.Spec.K8sPodName] = append(byPod[ep.Spec.K8sPodName], ep)
	}
	if health != 1 {
		c.addf("endpoint-health", "node", "%d endpoints without a pod, want exactly the health endpoint", health)
	}
	for name, eps := range byPod {
		if _, ok := live[name]; ok {
			continue
		}
		for _, ep := range eps {
			c.addf("endpoint-stale", "endpoint "+strconv.FormatInt(ep.ID, 10), "of deleted pod %s (container %s, IP %s, state %s)",
				name, shortID(ep.Spec.ContainerID), endpointIP(&ep), ep.Status.State)
		}
	}
	for name, p := range live {
		eps := byPod[name]
		if len(eps) != 1 {
			var ids []string
			for _, ep := range eps {
				ids = append(ids, fmt.Sprintf("%d (container %s, IP %s)", ep.ID, shortID(ep.Spec.ContainerID), endpointIP(&ep)))
			}
			c.addf("endpoint-count", "pod "+name, "%d endpoints, want 1: %v", len(eps), ids)
			continue
		}
		ep := eps[0]
		who := fmt.Sprintf("endpoint %d (pod %s)", ep.ID, name)
		sb, hasSB := sandboxes[name]
		cep, hasCEP := ceps[name]
		switch {
		case ep.Spec.K8sUID != "" && ep.Spec.K8sUID != p.UID:
			c.addf("endpoint-uid", who, "pod UID %s, the pod is %s", ep.Spec.K8sUID, p.UID)
		case endpointIP(&ep) != p.IP:
			c.addf("endpoint-ip", who, "IP %s, the pod's is %s", endpointIP(&ep), p.IP)
		case hasSB && ep.Spec.ContainerID != sb.ID:
			c.addf("endpoint-container", who, "container %s, the pod's sandbox is %s", shortID(ep.Spec.ContainerID), shortID(sb.ID))
		case ep.Status.State != models.EndpointStateReady:
			c.addf("endpoint-not-ready", who, "state %q", ep.Status.State)
		case hasCEP && cep.Identity != endpointIdentity(&ep):
			c.addf("endpoint-cep-identity", who, "identity %d, its CEP says %d", endpointIdentity(&ep), cep.Identity)
		case hasCEP && cep.ID != ep.ID:
			c.addf("endpoint-cep-id", who, "its CEP says endpoint ID %d", cep.ID)
		}
	}
	for ip, who := range ips {
		if len(who) > 1 {
			slices.Sort(who)
			c.addf("endpoint-ip-shared", "ip "+ip, "held by %v", who)
		}
	}
	return ips
}

// RouterOwner and HealthOwner are the IPAM owners of the node's reserved
// addresses.
const (
	RouterOwner = "router"
	HealthOwner = "health"
)

func (c *checker) checkIPAM(s *Snapshot, live map[string]Pod, endpointIPs map[string][]string) {
	epByIP := map[string]models.Endpoint{}
	for _, ep := range s.Endpoints {
		epByIP[endpointIP(&ep)] = ep
	}
	allocated := map[string]bool{}
	routers := 0
	for _, a := range s.IPAM {
		if allocated[a.IP] {
			c.addf("ipam-duplicate", "ip "+a.IP, "listed twice")
		}
		allocated[a.IP] = true
		if a.Owner == RouterOwner {
			routers++
			continue
		}
		ep, ok := epByIP[a.IP]
		if !ok {
			c.addf("ipam-leak", "ip "+a.IP, "allocated to %q but no endpoint has it", a.Owner)
			continue
		}
		if isPodEndpoint(&ep) {
			key := ep.Spec.K8sNamespace + "/" + ep.Spec.K8sPodName
			if !strings.Contains(a.Owner, key) && !strings.Contains(a.Owner, ep.Spec.ContainerID) {
				c.addf("ipam-owner", "ip "+a.IP, "allocated to %q, used by endpoint %d of pod %s", a.Owner, ep.ID, key)
			}
		} else if a.Owner != HealthOwner {
			c.addf("ipam-owner", "ip "+a.IP, "allocated to %q, used by endpoint %d (health)", a.Owner, ep.ID)
		}
	}
	if routers != 1 {
		c.addf("ipam-router", "node", "%d router addresses allocated, want 1", routers)
	}
	for ip, who := range endpointIPs {
		if !allocated[ip] {
			c.addf("ipam-unallocated", "ip "+ip, "used by %v but not allocated: IPAM may give it to another pod", who)
		}
	}
	if s.IPAMStateFile != nil {
		inFile := map[string]bool{}
		for _, ip := range s.IPAMStateFile {
			inFile[ip] = true
		}
		for _, a := range s.IPAM {
			if a.Owner != RouterOwner && !inFile[a.IP] {
				c.addf("ipam-state", "ip "+a.IP, "allocated but not in the IPAM state file: lost on restart")
			}
		}
		for ip := range inFile {
			if !allocated[ip] {
				c.addf("ipam-state", "ip "+ip, "in the IPAM state file but not allocated: claimed again on restart")
			}
		}
	}
}

func (c *checker) checkIdentities(s *Snapshot) {
	users := map[int64][]int64{}
	for _, ep := range s.Endpoints {
		if id := endpointIdentity(&ep); id != 0 {
			users[id] = append(users[id], ep.ID)
		}
	}
	if s.Allocations != nil {
		refs := map[int64]int{}
		for _, a := range s.Allocations {
			refs[a.ID] = a.Refs
			if n := len(users[a.ID]); n != a.Refs {
				c.addf("identity-refs", "identity "+strconv.FormatInt(a.ID, 10), "%d references, %d endpoints use it %v", a.Refs, n, users[a.ID])
			}
		}
		for id, eps := range users {
			if _, ok := refs[id]; !ok && !identity.NumericIdentity(id).IsReserved() {
				c.addf("identity-unreferenced", "identity "+strconv.FormatInt(id, 10), "used by endpoints %v but the agent holds no reference", eps)
			}
		}
	}
	for id, eps := range users {
		if identity.NumericIdentity(id).IsReserved() {
			continue
		}
		if !s.Identities[strconv.FormatInt(id, 10)] {
			c.addf("identity-object-missing", "identity "+strconv.FormatInt(id, 10), "used by endpoints %v but there is no CiliumIdentity %d", eps, id)
		}
	}
}

func (c *checker) checkNetns(s *Snapshot, e *Expect, live map[string]Pod, sandboxes map[string]devkubelet.Sandbox) {
	want := map[string]string{} // netns name -> pod
	for _, sb := range s.Sandboxes {
		want[sb.NetnsName()] = sb.Name
	}
	have := map[string]bool{}
	for _, n := range s.Netns {
		have[n] = true
		if _, ok := want[n]; !ok {
			c.addf("netns-leak", "netns "+n, "no sandbox owns it")
		}
	}
	for n, pod := range want {
		if !have[n] {
			c.addf("netns-missing", "netns "+n, "of pod %s is gone", pod)
		}
	}
	for name, p := range live {
		sb, ok := sandboxes[name]
		if !ok {
			continue
		}
		links, ok := s.PodLinks[sb.ID]
		if !ok {
			continue // reported as netns-missing
		}
		found := false
		for _, l := range links {
			if l.Name == sb.IfName {
				found = true
				if !slices.Contains(l.Addrs, p.IP) {
					c.addf("pod-interface", "pod "+name, "%s has addresses %v, the pod's IP is %s", l.Name, l.Addrs, p.IP)
				}
			} else {
				c.addf("pod-interface", "pod "+name, "unexpected interface %s in the pod's netns", l.Name)
			}
		}
		if !found {
			c.addf("pod-interface", "pod "+name, "no %s in netns %s", sb.IfName, sb.NetnsName())
		}
	}
}

func (c *checker) checkLinks(s *Snapshot, e *Expect, sandboxes map[string]devkubelet.Sandbox) {
	byName := map[string]link.HostLink{}
	for _, l := range s.HostLinks {
		byName[l.Name] = l
	}
	owned := map[string]bool{} // container IDs of recorded sandboxes
	for _, sb := range s.Sandboxes {
		owned[sb.ID] = true
	}
	for name, sb := range sandboxes {
		host := link.HostInterfaceName(sb.ID, sb.IfName)
		l, ok := byName[host]
		switch {
		case !ok:
			c.addf("veth-missing", "pod "+name, "host link %s of sandbox %s is gone", host, shortID(sb.ID))
		case l.ContainerID != sb.ID:
			c.addf("veth-alias", "pod "+name, "host link %s is labelled for container %s, the sandbox is %s", host, shortID(l.ContainerID), shortID(sb.ID))
		}
	}
	for _, ep := range s.Endpoints {
		if !isPodEndpoint(&ep) || ep.Spec.InterfaceName == "" {
			continue
		}
		l, ok := byName[ep.Spec.InterfaceName]
		switch {
		case !ok:
			c.addf("veth-missing", fmt.Sprintf("endpoint %d", ep.ID), "its host link %s is gone", ep.Spec.InterfaceName)
		case ep.Spec.InterfaceIndex != 0 && l.Index != ep.Spec.InterfaceIndex:
			c.addf("veth-index", fmt.Sprintf("endpoint %d", ep.ID), "host link %s has ifindex %d, the endpoint says %d", l.Name, l.Index, ep.Spec.InterfaceIndex)
		}
	}
	for _, l := range s.HostLinks {
		if e.ContainerPrefix != "" && strings.HasPrefix(l.ContainerID, e.ContainerPrefix) && !owned[l.ContainerID] {
			c.addf("veth-leak", "link "+l.Name, "of container %s, which has no sandbox any more", shortID(l.ContainerID))
		}
	}
}

func (c *checker) checkStateFiles(s *Snapshot) {
	ids := map[string]bool{}
	for _, ep := range s.Endpoints {
		ids[strconv.FormatInt(ep.ID, 10)+".json"] = true
	}
	have := map[string]bool{}
	for _, f := range s.StateFiles {
		have[f] = true
		if !ids[f] {
			c.addf("state-file-leak", "file "+f, "in the endpoint state directory, but no endpoint has that ID")
		}
	}
	for _, f := range slices.Sorted(maps.Keys(ids)) {
		if !have[f] {
			c.addf("state-file-missing", "file "+f, "the endpoint has no state file: it would be lost on restart")
		}
	}
}

// shortID is the first 12 characters of a container ID.
func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}
