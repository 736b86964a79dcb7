package doctor

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/cells/agentapi"
	"github.com/cellium/cellium/statedb/bpfprog"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/health"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/ipcache"
	"github.com/cellium/cellium/statedb/mapstate"
	"github.com/cellium/cellium/statedb/nodes"
	"github.com/cellium/cellium/statedb/reconciler"
)

// Kinds of findings. Documentation/operations/troubleshooting.md explains
// each one.
const (
	KindLeakedIP             = "leaked-ip"
	KindIPOwnerMismatch      = "ip-owner-mismatch"
	KindIPNotAllocated       = "ip-not-allocated"
	KindOrphanVeth           = "orphan-veth"
	KindEndpointWithoutVeth  = "endpoint-without-veth"
	KindStaleStateFile       = "stale-state-file"
	KindEndpointWithoutState = "endpoint-without-state-file"
	KindIdentityRefcount     = "identity-refcount"
	KindIdentityUnreferenced = "identity-unreferenced"
	KindCEPWithoutEndpoint   = "cep-without-endpoint"
	KindEndpointWithoutCEP   = "endpoint-without-cep"
	KindPodWithoutEndpoint   = "pod-without-endpoint"
	KindEndpointWithoutPod   = "endpoint-without-pod"
	// KindProgramsFailed: loading an endpoint's eBPF programs fails.
	KindProgramsFailed = "endpoint-programs-failed"
	// KindReadyWithoutPrograms: a ready endpoint's programs are not
	// attached for its identity.
	KindReadyWithoutPrograms = "endpoint-ready-without-programs"
	// KindPolicyMapFailed: an endpoint's policy map does not hold its
	// policy (a policy larger than the map: the map fails closed and the
	// endpoint drops all traffic).
	KindPolicyMapFailed = "endpoint-policy-map-failed"
	// KindNodeRefused: part of another node's CiliumNode (an address, a
	// pod CIDR) is malformed or claimed by another node, and not used.
	KindNodeRefused = "node-refused"
	// KindCEPRefused: a CiliumEndpoint of another node fails the
	// ipcache's checks, so its addresses have no identity here.
	KindCEPRefused = "cep-refused"
	// KindNodeUnreachable: another node does not answer the health
	// probes on some path.
	KindNodeUnreachable = "node-unreachable"
)

const (
	routerOwner               = "router"
	healthOwner               = "health"
	endpointObjectPrefix      = "endpoint "
	stateFileSuffix           = ".json"
	endpointStateSubdirectory = "endpoints"
)

// Allocation is one IPAM allocation as the doctor sees it.
type Allocation struct {
	IP    netip.Addr
	Owner string // "namespace/pod", "router", "health"
}

// HostLink is one host-side endpoint interface (name "lxc...").
type HostLink struct {
	Name string
	// ContainerID is the container recorded in the link's alias by the
	// CNI plugin; empty for links cellium did not make.
	ContainerID string
}

// Facts is one snapshot of everything the doctor compares. A nil slice or
// map whose Known flag is false means the source could not be read; its
// checks are skipped (and listed in Skipped).
type Facts struct {
	Endpoints []*endpoints.Endpoint

	Allocations      []Allocation
	AllocationsKnown bool

	Links      []HostLink
	LinksKnown bool

	// StateFiles maps endpoint IDs to the names of their state files.
	StateFiles      map[uint16]string
	StateFilesKnown bool

	// IdentityRefs is this agent's reference count per identity.
	IdentityRefs      map[identity.NumericIdentity]int
	IdentityRefsKnown bool

	// CEPs are the CiliumEndpoints whose status names this node.
	CEPs      []*ciliumv2.CiliumEndpoint
	CEPsKnown bool

	// Pods are the pods scheduled to this node.
	Pods      []*corev1.Pod
	PodsKnown bool

	// Programs are the eBPF loader's rows (statedb/bpfprog).
	Programs      []*bpfprog.Program
	ProgramsKnown bool

	// PolicyMaps are the policy map reconciler's rows (statedb/mapstate).
	PolicyMaps      []*mapstate.PolicyMap
	PolicyMapsKnown bool

	// ClusterNodes are the nodes table's rows (with what is refused of
	// each CiliumNode).
	ClusterNodes      []*nodes.Node
	ClusterNodesKnown bool

	// RefusedCEPs are the CEPs of other nodes the ipcache refuses.
	RefusedCEPs      []*ipcache.RefusedCEP
	RefusedCEPsKnown bool

	// NodePaths are the health probes of the other nodes.
	NodePaths      []*health.NodePath
	NodePathsKnown bool

	// Skipped says why checks were skipped.
	Skipped []string
}

// Check compares the facts and returns the findings, sorted by kind and
// object; an empty (non-nil) list when everything agrees.
func Check(f *Facts) []models.DoctorFinding {
	c := &checker{f: f, out: []models.DoctorFinding{}}
	c.byIP = map[netip.Addr]*endpoints.Endpoint{}
	c.byPod = map[string][]*endpoints.Endpoint{}
	for _, ep := range f.Endpoints {
		if ep.IPv4.IsValid() {
			c.byIP[ep.IPv4] = ep
		}
		if k := ep.PodKey(); k != "" {
			c.byPod[k] = append(c.byPod[k], ep)
		}
	}
	if f.AllocationsKnown {
		c.ips()
	}
	if f.LinksKnown {
		c.veths()
	}
	if f.StateFilesKnown {
		c.stateFiles()
	}
	if f.IdentityRefsKnown {
		c.identities()
	}
	if f.CEPsKnown {
		c.ceps()
	}
	if f.PodsKnown {
		c.pods()
	}
	if f.ProgramsKnown {
		c.programs()
	}
	if f.PolicyMapsKnown {
		c.policyMaps()
	}
	if f.ClusterNodesKnown {
		c.nodeRefusals()
	}
	if f.RefusedCEPsKnown {
		c.cepRefusals()
	}
	if f.NodePathsKnown {
		c.unreachableNodes()
	}
	slices.SortFunc(c.out, func(a, b models.DoctorFinding) int {
		return cmp.Or(cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Object, b.Object))
	})
	return c.out
}

type checker struct {
	f     *Facts
	byIP  map[netip.Addr]*endpoints.Endpoint
	byPod map[string][]*endpoints.Endpoint
	out   []models.DoctorFinding
}

func (c *checker) add(kind, object, message, hint string) {
	c.out = append(c.out, models.DoctorFinding{Kind: kind, Object: object, Message: message, Hint: hint})
}

// policyMaps finds endpoints whose policy map failed to take their
// policy.
func (c *checker) policyMaps() {
	byID := map[uint16]*endpoints.Endpoint{}
	for _, ep := range c.f.Endpoints {
		byID[ep.ID] = ep
	}
	for _, row := range c.f.PolicyMaps {
		ep := byID[row.EndpointID]
		if ep == nil || row.Identity != ep.Identity || row.Status.Kind != reconciler.StatusError {
			continue
		}
		msg, _, _ := strings.Cut(row.Status.Error, "\n")
		c.add(KindPolicyMapFailed, epObject(ep),
			fmt.Sprintf("the policy map of %s does not hold its policy (revision %d): %s", epObject(ep), row.Revision, msg),
			"a policy larger than the map fails closed (the endpoint drops all traffic): reduce the peers or ports the rules selecting it allow (Documentation/operations/bpf.md, Limits); cellium statedb "+mapstate.PoliciesTableName+" shows the reconciler's view")
	}
}

// nodeRefusals reports each refused part of a CiliumNode.
func (c *checker) nodeRefusals() {
	for _, n := range c.f.ClusterNodes {
		for _, r := range n.Refused {
			var hint string
			switch r.Reason {
			case nodes.RefusedDuplicateNodeIP, nodes.RefusedDuplicatePodCIDR:
				hint = "two CiliumNodes claim it; node " + r.Holder + " keeps it (the local node, else the older CiliumNode): " +
					"fix or delete the wrong CiliumNode (kubectl get ciliumnode " + n.Name + " " + r.Holder + " -o yaml); " +
					"a duplicate pod CIDR is an operator (IPAM) bug (Documentation/concepts/ipcache-trust.md)"
			default:
				hint = "fix " + r.Field + " of CiliumNode " + n.Name + " (kubectl edit ciliumnode " + n.Name + "): its agent writes the addresses, the operator the pod CIDRs"
			}
			c.add(KindNodeRefused, "node "+n.Name+" "+r.Field,
				fmt.Sprintf("CiliumNode %s: %s is not used (%s): nothing of it reaches the ipcache, the routes or the health probes", n.Name, r.String(), r.Reason),
				hint)
		}
	}
}

// cepRefusals reports each CEP of another node the ipcache refuses.
func (c *checker) cepRefusals() {
	for _, r := range c.f.RefusedCEPs {
		var hint string
		switch r.Reason {
		case ipcache.RefusedAddressOutsideNode:
			hint = "an address of the CEP is outside the pod CIDRs of node " + r.NodeIP + " (cellium node list): a stale or forged CEP, or a pod CIDR refused to that node"
		case ipcache.RefusedUnknownNode:
			hint = "no node has InternalIP " + r.NodeIP + " (cellium node list): the node left, or the CEP is stale or forged"
		case ipcache.RefusedUnknownIdentity:
			hint = fmt.Sprintf("no CiliumIdentity %d (kubectl get ciliumidentity %d): it may still be coming", r.Identity, r.Identity)
		default:
			hint = "see Documentation/concepts/ipcache-trust.md"
		}
		c.add(KindCEPRefused, "cep "+r.CEP,
			fmt.Sprintf("CiliumEndpoint %s (identity %d, node %s) is refused by the ipcache: %s; its addresses are world here", r.CEP, r.Identity, r.NodeIP, r.Reason),
			hint)
	}
}

// unreachableNodes reports the nodes a probed path to which failed.
func (c *checker) unreachableNodes() {
	failed := map[string][]string{}
	for _, p := range c.f.NodePaths {
		if p.Probed && !p.Reachable {
			failed[p.Node] = append(failed[p.Node], fmt.Sprintf("%s %s to %s: %s", p.Type, p.Protocol, p.IP, p.Error))
		}
	}
	for node, paths := range failed {
		slices.Sort(paths)
		c.add(KindNodeUnreachable, "node "+node,
			fmt.Sprintf("node %s does not answer: %s", node, strings.Join(paths, "; ")),
			"type node: the nodes' network (is the node up?); type endpoint: the tunnel or routes to its pods, or its agent; cellium health status lists every path (Documentation/operations/node-health.md)")
	}
}

func epObject(ep *endpoints.Endpoint) string {
	s := endpointObjectPrefix + strconv.Itoa(int(ep.ID))
	if k := ep.PodKey(); k != "" {
		s += " (" + k + ")"
	}
	return s
}

// expectedOwner is the IPAM owner an endpoint's address must have.
func expectedOwner(ep *endpoints.Endpoint) string {
	if ep.Health {
		return healthOwner
	}
	return ep.PodKey()
}

func (c *checker) ips() {
	allocated := map[netip.Addr]string{}
	for _, a := range c.f.Allocations {
		allocated[a.IP] = a.Owner
		if a.Owner == routerOwner {
			continue
		}
		ep, used := c.byIP[a.IP]
		if used {
			if want := expectedOwner(ep); want != "" && ownerKey(a.Owner) != want {
				c.add(KindIPOwnerMismatch, a.IP.String(),
					fmt.Sprintf("%s is allocated to %q but used by %s: releasing it for one would take it from the other", a.IP, a.Owner, epObject(ep)),
					"delete the pod that should not have this address (kubectl delete pod); its CNI DEL releases only what it owns")
			}
			continue
		}
		why := "no endpoint uses it"
		if others := c.byPod[ownerKey(a.Owner)]; len(others) > 0 {
			why = fmt.Sprintf("its owner's endpoint %d uses %s instead", others[0].ID, others[0].IPv4)
		} else if key := ownerKey(a.Owner); c.f.PodsKnown && isPodKey(key) && !c.podExists(key) {
			why = "its owner pod no longer exists"
		}
		c.add(KindLeakedIP, a.IP.String(),
			fmt.Sprintf("%s is allocated to %q but %s: the address is lost to the pool", a.IP, a.Owner, why),
			fmt.Sprintf("IPAM's garbage collection frees it after its grace period; to free it now: curl --unix-socket "+agentapi.DefaultSocketPath+" -X DELETE http://localhost/v1/ipam/%s", a.IP))
	}
	for _, ep := range c.f.Endpoints {
		if !ep.IPv4.IsValid() {
			continue
		}
		if _, ok := allocated[ep.IPv4]; !ok {
			c.add(KindIPNotAllocated, epObject(ep),
				fmt.Sprintf("%s uses %s, which IPAM has not allocated: IPAM may hand the address to another pod", epObject(ep), ep.IPv4),
				"recreate the pod (kubectl delete pod) so that it gets an allocated address")
		}
	}
}

// ownerKey is the owner an allocation is compared by: "namespace/pod"
// for a pod's allocation, cut before anything IPAM appends after the pod's
// name (a container ID, say), since a Kubernetes name has only [a-z0-9.-];
// other owners ("router", "health") unchanged.
func ownerKey(owner string) string {
	ns, rest, ok := strings.Cut(owner, "/")
	if !ok {
		return owner
	}
	end := strings.IndexFunc(rest, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '.' || r == '-')
	})
	if end >= 0 {
		rest = rest[:end]
	}
	return ns + "/" + rest
}

func isPodKey(owner string) bool {
	for i := 0; i < len(owner); i++ {
		if owner[i] == '/' {
			return i > 0 && i < len(owner)-1
		}
	}
	return false
}

func (c *checker) podExists(key string) bool {
	for _, p := range c.f.Pods {
		if p.Namespace+"/"+p.Name == key {
			return true
		}
	}
	return false
}

func (c *checker) veths() {
	links := map[string]bool{}
	byName := map[string]*endpoints.Endpoint{}
	for _, ep := range c.f.Endpoints {
		if ep.HostIfName != "" {
			byName[ep.HostIfName] = ep
		}
	}
	for _, l := range c.f.Links {
		links[l.Name] = true
		if _, ok := byName[l.Name]; ok {
			continue
		}
		owner := "no container recorded: not made by cellium-cni"
		if l.ContainerID != "" {
			owner = "made for container " + l.ContainerID
		}
		c.add(KindOrphanVeth, l.Name,
			fmt.Sprintf("host interface %s (%s) belongs to no endpoint: a pod's network was not torn down", l.Name, owner),
			fmt.Sprintf("the runtime's CNI GC removes it; to remove it now: ip link del %s", l.Name))
	}
	for _, ep := range c.f.Endpoints {
		if ep.HostIfName != "" && !links[ep.HostIfName] {
			c.add(KindEndpointWithoutVeth, epObject(ep),
				fmt.Sprintf("%s names host interface %s, which does not exist: the pod has no network", epObject(ep), ep.HostIfName),
				"delete the pod (kubectl delete pod) so that it is set up again")
		}
	}
}

func (c *checker) stateFiles() {
	ids := map[uint16]bool{}
	for _, ep := range c.f.Endpoints {
		ids[ep.ID] = true
		if _, ok := c.f.StateFiles[ep.ID]; !ok {
			c.add(KindEndpointWithoutState, epObject(ep),
				fmt.Sprintf("%s has no state file: an agent restart would forget it while its pod keeps running", epObject(ep)),
				fmt.Sprintf("regenerate it to write the file again: cellium endpoint regenerate %d", ep.ID))
		}
	}
	for id, name := range c.f.StateFiles {
		if !ids[id] {
			c.add(KindStaleStateFile, name,
				fmt.Sprintf("state file %s is for endpoint %d, which does not exist: an agent restart would restore it", name, id),
				"remove the file (its endpoint is gone)")
		}
	}
}

func (c *checker) identities() {
	used := map[identity.NumericIdentity][]*endpoints.Endpoint{}
	for _, ep := range c.f.Endpoints {
		if ep.Identity != 0 {
			used[ep.Identity] = append(used[ep.Identity], ep)
		}
	}
	for id, refs := range c.f.IdentityRefs {
		if n := len(used[id]); refs != n {
			meaning := "the identity would stay allocated after its last endpoint is gone"
			if refs < n {
				meaning = "the identity could be released while endpoints still use it"
			}
			c.add(KindIdentityRefcount, "identity "+id.StringID(),
				fmt.Sprintf("identity %s has %d references from this agent but %d endpoints use it: %s", id.StringID(), refs, n, meaning),
				"restart the agent: it rebuilds its references from the endpoints it restores")
		}
	}
	for id, eps := range used {
		if _, ok := c.f.IdentityRefs[id]; ok || id.IsReserved() {
			continue
		}
		for _, ep := range eps {
			c.add(KindIdentityUnreferenced, epObject(ep),
				fmt.Sprintf("%s uses identity %s, which this agent holds no reference to: it may be garbage-collected while in use", epObject(ep), id.StringID()),
				fmt.Sprintf("cellium endpoint regenerate %d", ep.ID))
		}
	}
}

func (c *checker) ceps() {
	byCEP := map[string]bool{}
	for _, ep := range c.f.Endpoints {
		byCEP[ep.CEPKey()] = true
	}
	have := map[string]bool{}
	for _, cep := range c.f.CEPs {
		key := cep.Namespace + "/" + cep.Name
		have[key] = true
		if !byCEP[key] {
			c.add(KindCEPWithoutEndpoint, "cep "+key,
				fmt.Sprintf("CiliumEndpoint %s says it is on this node but no endpoint here has it: other nodes still route and allow traffic to its IP", key),
				fmt.Sprintf("the agent's CEP sync deletes it; to delete it now: kubectl -n %s delete ciliumendpoint %s", cep.Namespace, cep.Name))
		}
	}
	for _, ep := range c.f.Endpoints {
		if ep.CEPName != "" && !have[ep.CEPKey()] {
			c.add(KindEndpointWithoutCEP, epObject(ep),
				fmt.Sprintf("%s has no CiliumEndpoint %s: other nodes do not know its identity, policy towards it may drop its traffic", epObject(ep), ep.CEPKey()),
				"check the agent's health (cellium status --verbose) for the CEP sync's error")
		}
	}
}

func (c *checker) pods() {
	pods := map[string]bool{}
	for _, p := range c.f.Pods {
		key := p.Namespace + "/" + p.Name
		pods[key] = true
		if p.Spec.HostNetwork || p.Status.PodIP == "" || p.DeletionTimestamp != nil ||
			p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		if len(c.byPod[key]) == 0 {
			c.add(KindPodWithoutEndpoint, "pod "+key,
				fmt.Sprintf("pod %s has IP %s but no endpoint on this node: it has no policy and no identity here", key, p.Status.PodIP),
				"delete the pod so that its sandbox is set up again (kubectl delete pod)")
		}
	}
	for _, ep := range c.f.Endpoints {
		if k := ep.PodKey(); k != "" && !ep.Health && !pods[k] {
			c.add(KindEndpointWithoutPod, epObject(ep),
				fmt.Sprintf("%s belongs to pod %s, which is not scheduled to this node any more", epObject(ep), k),
				fmt.Sprintf("the endpoint GC removes it; to remove it now: curl --unix-socket "+agentapi.DefaultSocketPath+" -X DELETE http://localhost/v1/endpoint/%d", ep.ID))
		}
	}
}

// programs checks that every endpoint that needs eBPF programs has them:
// a failed load, or a ready endpoint whose programs are not attached for
// its identity and veth.
func (c *checker) programs() {
	rows := map[uint16]*bpfprog.Program{}
	for _, p := range c.f.Programs {
		rows[p.EndpointID] = p
	}
	for _, ep := range c.f.Endpoints {
		want := bpfprog.Derive(ep, false)
		if want == nil {
			continue
		}
		row := rows[ep.ID]
		current := row != nil && row.Identity == want.Identity && row.HostIfName == want.HostIfName && row.HostIfIndex == want.HostIfIndex
		switch {
		case current && row.Status.Kind == reconciler.StatusError:
			msg, _, _ := strings.Cut(row.Status.Error, "\n")
			c.add(KindProgramsFailed, epObject(ep),
				fmt.Sprintf("the eBPF programs of %s fail to load: %s", epObject(ep), msg),
				"cellium statedb "+bpfprog.TableName+" shows the whole error (the verifier's log); the loader retries")
		case ep.State == ciliumv2.EndpointStateReady && (!current || row.Status.Kind != reconciler.StatusDone):
			c.add(KindReadyWithoutPrograms, epObject(ep),
				fmt.Sprintf("%s is ready but its eBPF programs are not attached for identity %d on %s: its policy may not be enforced", epObject(ep), ep.Identity, ep.HostIfName),
				"cellium endpoint regenerate "+strconv.Itoa(int(ep.ID))+"; cellium statedb "+bpfprog.TableName+" shows the loader's view")
		}
	}
}
