package endpointmanager

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"
	k8serrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/v1/models"
	identitycell "github.com/cellium/cellium/cells/identity"
	"github.com/cellium/cellium/cells/ipam"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/statedb/bpfprog"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/identity"
	ipamtables "github.com/cellium/cellium/statedb/ipam"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/labels"
	"github.com/cellium/cellium/statedb/mapstate"
	"github.com/cellium/cellium/statedb/nodes"
	statepolicy "github.com/cellium/cellium/statedb/policy"
	"github.com/cellium/cellium/statedb/tables"
)

// MaxEndpointID is the largest endpoint ID (IDs are 1..4095, as Cilium's).
const MaxEndpointID = 4095

// HealthEndpointNamespace is where the node's health endpoint's CEP lives.
const HealthEndpointNamespace = "kube-system"

// Manager creates, updates, restores and deletes local endpoints. It is
// the only writer of the endpoints table.
type Manager struct {
	log        *slog.Logger
	db         *statedb.DB
	table      statedb.RWTable[*endpoints.Endpoint]
	pods       statedb.Table[*corev1.Pod]
	namespaces statedb.Table[*corev1.Namespace]
	clientset  k8s.Clientset
	// ipamReqs is the IPAM requests table: the manager asks, the IPAM
	// cell answers (ipam.go); ipamIDs numbers the requests.
	ipamReqs statedb.RWTable[*ipamtables.Request]
	ipamIDs  atomic.Uint64
	// requests is the identity requests table: the manager writes what
	// each endpoint asks, the identity allocator answers (identity.go).
	requests statedb.RWTable[*identity.Request]
	attempts atomic.Uint64
	filter   identitycell.LabelFilter
	cluster  identitycell.ClusterName
	store    store
	node     k8s.NodeName
	now      func() time.Time

	// mu serialises endpoint ID choice and row replacement; the slow parts
	// (identity allocation) run outside it.
	mu     sync.Mutex
	nextID uint16

	// ceps (optional) and sysClassNet are what restore rebuilds an
	// endpoint from when its state file is unreadable (restore.go).
	ceps        statedb.Table[*ciliumv2.CiliumEndpoint]
	sysClassNet string

	// programs (optional: only with the eBPF loader) is the datapath's
	// bpf-programs table; endpoints are ready only once their programs
	// are attached (programs.go).
	programs statedb.Table[*bpfprog.Program]
	// policies (optional) is the policy engine's table an endpoint's
	// state is derived from once its identity is resolved (state.go).
	policies statedb.Table[*statepolicy.EndpointPolicyRow]
	// policyMaps (optional: only with the BPF map reconcilers) is the
	// datapath's policy-maps table: an endpoint is ready once its policy
	// map holds the revision it takes.
	policyMaps statedb.Table[*mapstate.PolicyMap]
}

// Manager errors carry a sentinel for the API's status code.
func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidRequest, fmt.Sprintf(format, args...))
}

// Create makes an endpoint for the pod described by req: it resolves the
// pod's labels to an identity and returns once the endpoint is ready. The
// address must be allocated to the request's container (POST /v1/ipam
// with its container ID): the endpoint claims exactly that allocation. A
// request for a pod that already has an endpoint with another container ID
// (a new sandbox) replaces the old endpoint. A container that already has
// an endpoint keeps it: the same request again (same address, interface
// and network namespace) returns it once it is ready, any other is a
// conflict. On failure
// nothing is left but the address, which stays with the caller.
func (m *Manager) Create(ctx context.Context, req *models.EndpointChangeRequest) (*endpoints.Endpoint, error) {
	ip, err := validate(req)
	if err != nil {
		return nil, err
	}
	// One bound for all the create waits for (the pod, the address, the
	// identity, the first regeneration), so that the caller gets the
	// reason before its own timeout.
	ctx, cancel := context.WithTimeoutCause(ctx, RegenerationWait, errCreateTimeout)
	defer cancel()
	if old, _, ok := m.table.Get(m.db.ReadTxn(), endpoints.ContainerIndex.Query(req.ContainerID)); ok {
		if sameAttachment(old, req, ip) && old.InService() {
			if req.SyncBuildEndpoint {
				return m.waitReady(ctx, old)
			}
			return old, nil
		}
		return nil, conflictingContainer(old)
	}
	pod, err := m.lookupPod(ctx, req.K8sNamespace, req.K8sPodName, req.K8sUID)
	if err != nil {
		return nil, err
	}
	owner := ipam.Owner{Name: req.K8sNamespace + "/" + req.K8sPodName, ContainerID: req.ContainerID}
	switch err := m.claimIP(ctx, ip, owner); {
	case errors.Is(err, ipam.ErrNotAllocated):
		return nil, invalid("%v", err)
	case errors.Is(err, ipam.ErrNotOwner):
		return nil, fmt.Errorf("%w: %v", ErrConflict, err)
	case err != nil:
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	ep := &endpoints.Endpoint{
		ContainerID:     req.ContainerID,
		ContainerIfName: req.ContainerInterfaceName,
		PodNamespace:    req.K8sNamespace,
		PodName:         req.K8sPodName,
		PodUID:          req.K8sUID,
		CEPNamespace:    req.K8sNamespace,
		CEPName:         req.K8sPodName,
		HostIfName:      req.InterfaceName,
		HostIfIndex:     req.InterfaceIndex,
		MAC:             req.MAC,
		HostMAC:         req.HostMAC,
		NetnsPath:       req.NetnsPath,
		IPv4:            ip,
		Created:         m.now(),
	}
	if pod != nil {
		ep.PodUID = string(pod.UID)
		ep.ServiceAccount = pod.Spec.ServiceAccountName
		ep.NamedPorts = namedPorts(pod)
	}
	ep.Labels, ep.InfoLabels = m.podLabels(m.db.ReadTxn(), pod, req.K8sNamespace)

	// Insert in waiting-for-identity, replacing an older sandbox's endpoint.
	ep, replaced, err := m.insertNew(ep)
	if err != nil {
		return nil, err
	}
	for _, old := range replaced {
		m.cleanup(ctx, old, "replaced by a new sandbox of the same pod")
	}
	// Resolve the identity; then the endpoint regenerates with its policy.
	ready, err := m.resolveIdentity(ctx, ep)
	if err != nil {
		m.remove(ctx, ep, false)
		return nil, fmt.Errorf("%w: allocate identity for %s: %v", ErrUnavailable, ep.PodKey(), err)
	}
	if !req.SyncBuildEndpoint && !m.wantsPrograms(ready) {
		return ready, nil
	}
	// As in Cilium, the CNI plugin's request waits for the first
	// regeneration: the pod starts with its policy computed (and, with
	// the eBPF datapath, enforced: programs attached, policy map written).
	done, err := m.waitReady(ctx, ready)
	if err != nil {
		m.remove(ctx, ready, false)
		return nil, err
	}
	return done, nil
}

// waitReady waits, at most RegenerationWait, until ep is ready.
//
// Possible errors: ErrUnavailable when it is not ready in time (its
// policy was not computed: the policy engine waits for the policy tables,
// see `cellium status`), when it is not-ready (the datapath refused its
// policy) or ctx ends; ErrNotFound when it was deleted meanwhile.
func (m *Manager) waitReady(ctx context.Context, ep *endpoints.Endpoint) (*endpoints.Endpoint, error) {
	timer := time.NewTimer(RegenerationWait)
	defer timer.Stop()
	for {
		txn := m.db.ReadTxn()
		cur, _, watch, ok := m.table.GetWatch(txn, endpoints.IDIndex.Query(ep.ID))
		switch {
		case !ok || !sameEndpoint(cur, ep):
			return nil, fmt.Errorf("%w: endpoint %d was deleted while it regenerated", ErrNotFound, ep.ID)
		case cur.State == ciliumv2.EndpointStateReady:
			return cur, nil
		case cur.State == ciliumv2.EndpointStateNotReady:
			// The datapath refused its policy (the last log entry says
			// why): waiting would not help.
			return nil, fmt.Errorf("%w: endpoint %d of %s is not-ready: %s", ErrUnavailable, ep.ID, ep.PodKey(), lastMessage(cur))
		}
		var progWatch <-chan struct{}
		if m.wantsPrograms(cur) {
			if st, msg := bpfprog.EndpointState(txn, m.programs, cur); st == bpfprog.StateFailed {
				return nil, fmt.Errorf("%w: load the BPF programs of endpoint %d: %s", ErrUnavailable, ep.ID, msg)
			}
			_, progWatch = m.programs.AllWatch(txn)
		}
		select {
		case <-watch:
		case <-progWatch:
		case <-ctx.Done():
			if errors.Is(context.Cause(ctx), errCreateTimeout) {
				return nil, m.notReadyError(ep)
			}
			return nil, fmt.Errorf("%w: endpoint %d of %s is %s: %v", ErrUnavailable, ep.ID, ep.PodKey(), cur.State, ctx.Err())
		case <-timer.C:
			return nil, m.notReadyError(ep)
		}
	}
}

// errCreateTimeout ends the wait of a create that took RegenerationWait.
var errCreateTimeout = fmt.Errorf("the endpoint was not ready within %v", RegenerationWait)

// notReadyError is the error of a wait for ep that took RegenerationWait:
// the state of the endpoint and what it waits for.
func (m *Manager) notReadyError(ep *endpoints.Endpoint) error {
	txn := m.db.ReadTxn()
	cur, _, ok := m.table.Get(txn, endpoints.IDIndex.Query(ep.ID))
	if !ok || !sameEndpoint(cur, ep) {
		return fmt.Errorf("%w: endpoint %d was deleted while it regenerated", ErrNotFound, ep.ID)
	}
	return fmt.Errorf("%w: endpoint %d of %s (identity %s) is still %s after %v: %s; retry later",
		ErrUnavailable, ep.ID, ep.PodKey(), cur.Identity.StringID(), cur.State, RegenerationWait, m.notReadyReason(txn, cur))
}

// lastMessage is the message of the endpoint's last log entry.
func lastMessage(ep *endpoints.Endpoint) string {
	if n := len(ep.Log); n > 0 && ep.Log[n-1] != nil {
		return ep.Log[n-1].Message
	}
	return string(ep.State)
}

// sameAttachment reports whether req asks again for the endpoint ep
// already is: same container, address, interfaces and network namespace.
func sameAttachment(ep *endpoints.Endpoint, req *models.EndpointChangeRequest, ip netip.Addr) bool {
	return ep.ContainerID == req.ContainerID && ep.IPv4 == ip && ep.ContainerIfName == req.ContainerInterfaceName &&
		ep.HostIfName == req.InterfaceName && ep.NetnsPath == req.NetnsPath &&
		ep.PodNamespace == req.K8sNamespace && ep.PodName == req.K8sPodName
}

// conflictingContainer is the error of a request for a container that
// already has another endpoint.
func conflictingContainer(old *endpoints.Endpoint) error {
	return fmt.Errorf("%w: container %s already has endpoint %d (pod %s, %s, interface %s in %s); it is left as it is: run CNI DEL for the container first",
		ErrConflict, old.ContainerID, old.ID, old.PodKey(), old.IPv4, old.HostIfName, old.NetnsPath)
}

func validate(req *models.EndpointChangeRequest) (netip.Addr, error) {
	var missing []string
	for _, f := range []struct{ name, value string }{
		{"container-id", req.ContainerID},
		{"k8s-namespace", req.K8sNamespace},
		{"k8s-pod-name", req.K8sPodName},
		{"interface-name", req.InterfaceName},
		{"addressing.ipv4", req.Addressing.IPV4},
	} {
		if f.value == "" {
			missing = append(missing, f.name)
		}
	}
	if len(missing) > 0 {
		return netip.Addr{}, invalid("missing %s", strings.Join(missing, ", "))
	}
	ip, err := netip.ParseAddr(req.Addressing.IPV4)
	if err != nil || !ip.Is4() {
		return netip.Addr{}, invalid("addressing.ipv4 %q is not an IPv4 address", req.Addressing.IPV4)
	}
	if req.ContainerInterfaceName == "" {
		req.ContainerInterfaceName = "eth0"
	}
	return ip, nil
}

// lookupPod finds the pod in the pods table, or asks the API server when
// the table lags behind. A pod that does not exist is not an error: such
// an endpoint (cnitool, tests) gets the reserved init identity and no CEP.
func (m *Manager) lookupPod(ctx context.Context, ns, name, uid string) (*corev1.Pod, error) {
	waitCtx, cancel := context.WithTimeout(ctx, PodsSyncWait)
	defer cancel()
	// The namespaces too: their labels are part of the pod's identity,
	// and a pod labelled without them would take a wrong identity first.
	if err := tables.WaitInitialized(waitCtx, m.db, m.pods, m.namespaces); err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%w: the pods and namespaces tables are not synced yet: %v", ErrUnavailable, ctx.Err())
		}
		return nil, fmt.Errorf("%w: the pods of this node and the namespaces are not listed yet (is the Kubernetes API server reachable? see `cellium status`); retry later", ErrUnavailable)
	}
	pod, _, found := m.pods.Get(m.db.ReadTxn(), k8stables.NameIndex[*corev1.Pod]().Query(ns+"/"+name))
	if found && (uid == "" || string(pod.UID) == uid) {
		return pod, nil
	}
	if !m.clientset.IsEnabled() {
		return nil, nil
	}
	fresh, err := m.clientset.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	switch {
	case k8serrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("%w: get pod %s/%s: %v", ErrUnavailable, ns, name, err)
	case uid != "" && string(fresh.UID) != uid:
		return nil, fmt.Errorf("%w: pod %s/%s has UID %s, the request is for UID %s (the pod was re-created)", ErrConflict, ns, name, fresh.UID, uid)
	}
	return fresh, nil
}

// labelSourcesSynced reports whether the pods and namespaces tables hold
// their first list: a pod's labels are complete only with its
// namespace's (io.cilium.k8s.namespace.labels.*).
func (m *Manager) labelSourcesSynced(txn statedb.ReadTxn) bool {
	pods, _ := m.pods.Initialized(txn)
	nss, _ := m.namespaces.Initialized(txn)
	return pods && nss
}

// podLabels computes the identity-relevant and informational labels.
func (m *Manager) podLabels(txn statedb.ReadTxn, pod *corev1.Pod, ns string) (labels.Labels, labels.Labels) {
	if pod == nil {
		return labels.New(labels.Reserved(labels.IDNameInit)), labels.Labels{}
	}
	var nsLabels map[string]string
	if n, _, ok := m.namespaces.Get(txn, k8stables.NameIndex[*corev1.Namespace]().Query(ns)); ok {
		nsLabels = n.Labels
	}
	all := labels.FromK8sPod(pod.Labels, ns, nsLabels, pod.Spec.ServiceAccountName, string(m.cluster))
	return m.filter.Split(all)
}

func namedPorts(pod *corev1.Pod) ciliumv2.NamedPorts {
	var out ciliumv2.NamedPorts
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			if p.Name == "" {
				continue
			}
			proto := string(p.Protocol)
			if proto == "" {
				proto = "TCP"
			}
			out = append(out, &ciliumv2.Port{Name: p.Name, Port: uint16(p.ContainerPort), Protocol: proto})
		}
	}
	slices.SortFunc(out, func(a, b *ciliumv2.Port) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// insertNew assigns an ID and inserts ep in waiting-for-identity. Older
// endpoints of the same pod are removed from the table in the same
// transaction and returned for cleanup.
func (m *Manager) insertNew(ep *endpoints.Endpoint) (*endpoints.Endpoint, []*endpoints.Endpoint, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	txn := m.db.WriteTxn(m.table, m.requests)
	defer txn.Abort()
	if ep.ContainerID != "" {
		if old, _, ok := m.table.Get(txn, endpoints.ContainerIndex.Query(ep.ContainerID)); ok {
			return nil, nil, conflictingContainer(old)
		}
	}
	if old, _, ok := m.table.Get(txn, endpoints.IPIndex.Query(ep.IPv4)); ok {
		return nil, nil, fmt.Errorf("%w: IP %s is already used by endpoint %d (pod %s)", ErrConflict, ep.IPv4, old.ID, old.PodKey())
	}
	var replaced []*endpoints.Endpoint
	if !ep.Health {
		for old := range m.table.List(txn, endpoints.PodIndex.Query(ep.PodKey())) {
			replaced = append(replaced, old)
			if _, _, err := m.table.Delete(txn, old); err != nil {
				return nil, nil, err
			}
			if err := m.withdrawIdentity(txn, old.ID); err != nil {
				return nil, nil, err
			}
			// Inside the transaction: the new endpoint may get this ID.
			if err := m.store.remove(old.ID); err != nil {
				return nil, nil, err
			}
		}
	}
	id, err := m.freeID(txn)
	if err != nil {
		return nil, nil, err
	}
	ep.ID = id
	ep = ep.WithState(ciliumv2.EndpointStateWaitingForIdentity, "Endpoint created", m.now())
	if _, _, err := m.table.Insert(txn, ep); err != nil {
		return nil, nil, err
	}
	if err := m.store.save(ep); err != nil {
		return nil, nil, err
	}
	txn.Commit()
	return ep, replaced, nil
}

// freeID returns the next unused endpoint ID after the last one handed out.
func (m *Manager) freeID(txn statedb.ReadTxn) (uint16, error) {
	for i := 0; i < MaxEndpointID; i++ {
		m.nextID = m.nextID%MaxEndpointID + 1
		if _, _, used := m.table.Get(txn, endpoints.IDIndex.Query(m.nextID)); !used {
			return m.nextID, nil
		}
	}
	return 0, ErrIDsExhausted
}

// resolveIdentity asks for the identity of ep's labels and makes it
// ready. The endpoint's request holds the reference: the one to the
// identity it had before (label change) is dropped by the allocator as
// it answers.
func (m *Manager) resolveIdentity(ctx context.Context, ep *endpoints.Endpoint) (*endpoints.Endpoint, error) {
	id, err := m.requestIdentity(ctx, ep)
	if errors.Is(err, errSuperseded) {
		cur, ok := m.Get(ep.ID)
		if !ok {
			return nil, fmt.Errorf("%w: endpoint %d was deleted while resolving its identity", ErrNotFound, ep.ID)
		}
		return cur, nil
	}
	if err != nil {
		return nil, err
	}
	var updated *endpoints.Endpoint
	err = m.modify(ep.ID, func(cur *endpoints.Endpoint) *endpoints.Endpoint {
		if !sameEndpoint(cur, ep) || !cur.Labels.Equal(ep.Labels) {
			return nil // labels changed meanwhile: that change resolves again
		}
		c := cur.Clone()
		c.Identity = id
		state, msg := m.inServiceState(c)
		c = c.WithState(state, msg+" (identity "+id.String()+")", m.now())
		c.IdentityPending = false
		updated = c
		return c
	})
	if err != nil {
		return nil, err
	}
	if updated == nil {
		cur, ok := m.Get(ep.ID)
		if !ok {
			return nil, fmt.Errorf("%w: endpoint %d was deleted while resolving its identity", ErrNotFound, ep.ID)
		}
		return cur, nil
	}
	return updated, nil
}

// modify applies fn to the current row (nil result: no change), saves and
// commits. ErrNotFound if the endpoint is gone.
func (m *Manager) modify(id uint16, fn func(*endpoints.Endpoint) *endpoints.Endpoint) error {
	txn := m.db.WriteTxn(m.table)
	defer txn.Abort()
	cur, _, ok := m.table.Get(txn, endpoints.IDIndex.Query(id))
	if !ok {
		return fmt.Errorf("%w: ID %d", ErrNotFound, id)
	}
	next := fn(cur)
	if next == nil {
		return nil
	}
	if _, _, err := m.table.Insert(txn, next); err != nil {
		return err
	}
	if err := m.store.save(next); err != nil {
		return err
	}
	txn.Commit()
	return nil
}

// DeleteByContainer deletes the endpoint of a CNI attachment and frees
// the container's addresses: every address allocated with containerID, or
// only ip when it is valid (a rollback: then the endpoint is deleted only
// if it has ip). It works without an endpoint too (an ADD that died before
// creating it). ErrNotFound if there was nothing to delete or free.
func (m *Manager) DeleteByContainer(ctx context.Context, containerID string, ip netip.Addr) error {
	did := false
	if ep, _, ok := m.table.Get(m.db.ReadTxn(), endpoints.ContainerIndex.Query(containerID)); ok && (!ip.IsValid() || ep.IPv4 == ip) {
		did = m.delete(ctx, ep)
	}
	if ip.IsValid() {
		released, err := m.releaseOwned(ctx, ip, ipam.Owner{ContainerID: containerID})
		switch {
		case errors.Is(err, ipam.ErrNotOwner):
			m.log.Warn("not releasing an address another container holds", "containerID", containerID, "ip", ip, "error", err)
		case err != nil:
			return fmt.Errorf("%w: %v", ErrUnavailable, err)
		}
		did = did || released
	} else {
		released, err := m.releaseContainer(ctx, containerID)
		for _, al := range released {
			m.log.Info("released an address of a deleted container", "containerID", containerID, "ip", al.IP, "owner", al.Owner)
		}
		if err != nil {
			return fmt.Errorf("%w: %v", ErrUnavailable, err)
		}
		did = did || len(released) > 0
	}
	if !did {
		return fmt.Errorf("%w: container %s has no endpoint and no address", ErrNotFound, containerID)
	}
	return nil
}

// Delete deletes an endpoint by ID, releasing its IP and identity.
// ErrNotFound if there is none, or another caller deleted it first.
func (m *Manager) Delete(ctx context.Context, id uint16) error {
	ep, ok := m.Get(id)
	if !ok || !m.delete(ctx, ep) {
		return fmt.Errorf("%w: ID %d", ErrNotFound, id)
	}
	return nil
}

// delete marks ep disconnecting and removes it; false if another caller
// removed it first (then that caller releases what it held).
func (m *Manager) delete(ctx context.Context, ep *endpoints.Endpoint) bool {
	_ = m.modify(ep.ID, func(cur *endpoints.Endpoint) *endpoints.Endpoint {
		if !sameEndpoint(cur, ep) {
			return nil
		}
		return cur.WithState(ciliumv2.EndpointStateDisconnecting, "Deleting endpoint", m.now())
	})
	return m.remove(ctx, ep, true)
}

// sameEndpoint reports whether cur is the row ep was read from (an ID is
// reused once its endpoint is gone).
func sameEndpoint(cur, ep *endpoints.Endpoint) bool {
	return cur.ContainerID == ep.ContainerID && cur.IPv4 == ep.IPv4 && cur.Created.Equal(ep.Created)
}

// remove deletes the row and state of ep and releases what it held. The
// table delete is the commit point: only the caller whose transaction
// removed the row releases the identity, the state file and (releaseIP)
// the address, so concurrent deletes, a delete racing a replacement or a
// restore release each once. It reports whether this call removed it.
func (m *Manager) remove(ctx context.Context, ep *endpoints.Endpoint, releaseIP bool) bool {
	txn := m.db.WriteTxn(m.table, m.requests)
	defer txn.Abort()
	cur, _, ok := m.table.Get(txn, endpoints.IDIndex.Query(ep.ID))
	if !ok || !sameEndpoint(cur, ep) {
		return false
	}
	if _, _, err := m.table.Delete(txn, cur); err != nil {
		m.log.Warn("delete endpoint row", "endpoint", ep.ID, "error", err)
		return false
	}
	if err := m.withdrawIdentity(txn, cur.ID); err != nil {
		m.log.Warn("withdraw identity request", "endpoint", ep.ID, "error", err)
		return false
	}
	// Inside the transaction: a new endpoint may get this ID once it
	// commits.
	if err := m.store.remove(cur.ID); err != nil {
		m.log.Warn("remove endpoint state", "endpoint", cur.ID, "error", err)
	}
	txn.Commit()
	m.cleanup(ctx, cur, "")
	if releaseIP {
		m.releaseIP(ctx, cur, "")
	}
	return true
}

// releaseIP frees ep's address if ep's container (or, without one, its
// owner) still holds it.
func (m *Manager) releaseIP(ctx context.Context, ep *endpoints.Endpoint, why string) {
	owner := ipam.Owner{Name: ep.PodKey(), ContainerID: ep.ContainerID}
	if ep.Health {
		owner.Name = HealthIPOwner
	}
	if _, err := m.releaseOwned(ctx, ep.IPv4, owner); err != nil {
		m.log.Warn("release endpoint IP", "endpoint", ep.ID, "ip", ep.IPv4, "reason", why, "error", err)
	}
}

// cleanup finishes the removal of an endpoint its caller removed from the
// table (with its state file and its identity request, whose reference
// the identity allocator drops). A replaced sandbox's IP is released:
// its CNI DEL will not find an endpoint to release it through.
func (m *Manager) cleanup(ctx context.Context, ep *endpoints.Endpoint, replacedWhy string) {
	if replacedWhy != "" {
		m.log.Info("endpoint removed", "endpoint", ep.ID, "pod", ep.PodKey(), "reason", replacedWhy)
		m.releaseIP(ctx, ep, replacedWhy)
	}
}

// Get returns an endpoint by ID.
func (m *Manager) Get(id uint16) (*endpoints.Endpoint, bool) {
	ep, _, ok := m.table.Get(m.db.ReadTxn(), endpoints.IDIndex.Query(id))
	return ep, ok
}

// Regenerate resolves the endpoint's labels and identity again.
func (m *Manager) Regenerate(ctx context.Context, id uint16) (*endpoints.Endpoint, error) {
	ep, ok := m.Get(id)
	if !ok {
		return nil, fmt.Errorf("%w: ID %d", ErrNotFound, id)
	}
	return m.relabel(ctx, ep, nil, true)
}

// PatchLabels adds labels (source "unspec" unless the key says
// "source:key") to the endpoint's identity labels, or deletes them by key,
// and moves the endpoint to the matching identity.
func (m *Manager) PatchLabels(ctx context.Context, id uint16, patch models.LabelsPatch) (*endpoints.Endpoint, error) {
	ep, ok := m.Get(id)
	if !ok {
		return nil, fmt.Errorf("%w: ID %d", ErrNotFound, id)
	}
	var add []labels.Label
	for k, v := range patch.Add {
		l := labels.Parse(k + "=" + v)
		if l.Source == labels.SourceReserved {
			return nil, invalid("label %s: reserved labels cannot be set", l)
		}
		add = append(add, l)
	}
	next := ep.Labels.Merge(labels.New(add...)).FilterFunc(func(l labels.Label) bool {
		for _, d := range patch.Delete {
			if l.Key == d || l.Source+":"+l.Key == d {
				return false
			}
		}
		return true
	})
	return m.relabel(ctx, ep, &next, true)
}

// relabel recomputes (or takes) the labels of ep and, when they changed or
// force is set, resolves the identity again.
func (m *Manager) relabel(ctx context.Context, ep *endpoints.Endpoint, lbls *labels.Labels, force bool) (*endpoints.Endpoint, error) {
	next := ep.Labels
	info := ep.InfoLabels
	if lbls != nil {
		next = *lbls
	} else if ep.PodName != "" && !ep.Health {
		// Until both are listed the endpoint keeps the labels it has:
		// without its namespace's labels a pod would move to another
		// identity and back.
		txn := m.db.ReadTxn()
		pod, _, ok := m.pods.Get(txn, k8stables.NameIndex[*corev1.Pod]().Query(ep.PodKey()))
		if ok && string(pod.UID) == ep.PodUID && m.labelSourcesSynced(txn) {
			next, info = m.podLabels(txn, pod, ep.PodNamespace)
		}
	}
	if next.Equal(ep.Labels) && !force {
		return ep, nil
	}
	var changed *endpoints.Endpoint
	if err := m.modify(ep.ID, func(cur *endpoints.Endpoint) *endpoints.Endpoint {
		c := cur.WithState(ciliumv2.EndpointStateWaitingToRegenerate, "Labels changed, regenerating", m.now())
		c.Labels, c.InfoLabels = next, info
		c.IdentityPending = true
		changed = c
		return c
	}); err != nil {
		return nil, err
	}
	ready, err := m.resolveIdentity(ctx, changed)
	if err != nil && ctx.Err() == nil {
		m.markFailed(changed.ID, fmt.Sprintf("allocate identity for labels %s: %v", endpoints.LabelsString(changed.Labels), err))
	}
	return ready, err
}

// List returns every endpoint, by ID.
func (m *Manager) List() []*endpoints.Endpoint {
	var out []*endpoints.Endpoint
	for ep := range m.table.All(m.db.ReadTxn()) {
		out = append(out, ep)
	}
	return out
}

// NodeIP is this node's InternalIP from the local-node table, or "".
func (m *Manager) NodeIP(txn statedb.ReadTxn, local statedb.Table[*nodes.LocalNode]) string {
	ip, _ := nodes.LocalInternalIP(txn, local, string(m.node))
	return ip
}
