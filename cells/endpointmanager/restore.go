package endpointmanager

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/ipam"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/identity"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/tables"
)

// restoredClaims are the addresses of restored endpoints, for IPAM to
// hold before it serves new allocations.
func restoredClaims(restored []*endpoints.Endpoint) []ipam.Claim {
	out := make([]ipam.Claim, 0, len(restored))
	for _, ep := range restored {
		if ep.IPv4.IsValid() {
			out = append(out, ipam.Claim{IP: ep.IPv4, Owner: ipam.Owner{Name: ep.PodKey(), ContainerID: ep.ContainerID}})
		}
	}
	return out
}

// loadRestored reads the saved endpoints into the table in state
// restoring, keeping their IDs. It runs in the start hook, before the API
// serves, so that a CNI DEL for a restored endpoint finds it. A state file
// that cannot be read is quarantined (see store.load) and its ID held by
// a placeholder row (state invalid, a failed log entry saying which file
// and what to do) until validateRestored rebuilds the endpoint or the
// operator deletes it; the placeholder keeps the ID from being handed out
// again and the endpoint's CiliumEndpoint from being pruned.
func (m *Manager) loadRestored() ([]*endpoints.Endpoint, error) {
	saved, bad, err := m.store.load()
	if err != nil {
		return nil, err
	}
	txn := m.db.WriteTxn(m.table, m.requests)
	defer txn.Abort()
	var restored []*endpoints.Endpoint
	for _, ep := range saved {
		if ep.Health {
			_ = m.store.remove(ep.ID) // the health endpoint is made anew
			continue
		}
		ep = ep.WithState(ciliumv2.EndpointStateRestoring, "Restoring endpoint after agent restart", m.now())
		ep.PolicyRestored = true
		// The allocator may hand the saved identity out again for the
		// same labels while the cluster's identities are not listed
		// (booted with the API server down).
		if ep.Identity != identity.InvalidIdentity {
			if _, _, err := m.requests.Insert(txn, restoreIdentityRequest(ep, ep.Identity)); err != nil {
				return nil, fmt.Errorf("restore the identity request of endpoint %d: %w", ep.ID, err)
			}
		}
		// This process holds no reference to the old identity yet: the
		// endpoint gets one when restore resolves its labels again.
		ep.Identity = identity.InvalidIdentity
		if _, _, err := m.table.Insert(txn, ep); err != nil {
			return nil, fmt.Errorf("restore endpoint %d: %w", ep.ID, err)
		}
		restored = append(restored, ep)
		m.nextID = max(m.nextID, ep.ID)
	}
	for _, q := range bad {
		if q.ID == 0 {
			m.log.Error("unreadable endpoint state file without an endpoint ID in its name; moved aside", "file", q.File, "movedTo", q.Moved, "error", q.Err)
			continue
		}
		if _, _, taken := m.table.Get(txn, endpoints.IDIndex.Query(q.ID)); taken {
			continue // a newer, valid file of the same ID (already rebuilt)
		}
		ep := placeholder(q, m.now())
		m.log.Error("endpoint state file is corrupt; its endpoint ID stays reserved", "endpoint", q.ID, "file", q.File, "movedTo", q.Moved, "error", q.Err)
		if _, _, err := m.table.Insert(txn, ep); err != nil {
			return nil, fmt.Errorf("reserve endpoint %d: %w", q.ID, err)
		}
		restored = append(restored, ep)
		m.nextID = max(m.nextID, q.ID)
	}
	txn.Commit()
	if len(restored) > 0 {
		m.log.Info("restoring endpoints", "count", len(restored))
	}
	return restored, nil
}

// placeholder is the row that holds the ID of an endpoint whose state
// file is quarantined.
func placeholder(q quarantined, now time.Time) *endpoints.Endpoint {
	ep := (&endpoints.Endpoint{ID: q.ID, Created: now}).
		WithState(ciliumv2.EndpointStateInvalid, "Endpoint state file unreadable", now)
	return ep.WithFailure(quarantineMessage(q, ""), now)
}

// isPlaceholder reports whether ep only holds the ID of a quarantined
// state file: nothing is known about it.
func isPlaceholder(ep *endpoints.Endpoint) bool {
	return ep.State == ciliumv2.EndpointStateInvalid && ep.ContainerID == "" && ep.PodName == "" && !ep.Health
}

func quarantineMessage(q quarantined, rebuild string) string {
	file := q.Moved
	if file == "" {
		file = q.File
	}
	msg := fmt.Sprintf("state file of endpoint %d is unreadable (%v), kept as %s; the ID stays reserved", q.ID, q.Err, file)
	if rebuild != "" {
		msg += "; not rebuilt: " + rebuild
	}
	return msg + ". If the pod of this endpoint has no network, delete the pod (it is re-created with a new endpoint); once no pod uses endpoint " +
		fmt.Sprint(q.ID) + ", remove " + file + " and DELETE /v1/endpoint/" + fmt.Sprint(q.ID)
}

// rebuild recreates the endpoint of a placeholder from what the cluster
// and the node still know: the CiliumEndpoint this agent wrote for it
// (status.id, pod, container ID, IP), the pod (UID, on this node) and the
// host link whose alias names the container. nil and the reason when
// that is not enough.
func (m *Manager) rebuild(ph *endpoints.Endpoint, ceps statedb.Table[*ciliumv2.CiliumEndpoint]) (*endpoints.Endpoint, string) {
	if ceps == nil {
		return nil, "CiliumEndpoints are not watched"
	}
	txn := m.db.ReadTxn()
	if ok, _ := ceps.Initialized(txn); !ok {
		return nil, "CiliumEndpoints not listed yet"
	}
	for cep := range ceps.All(txn) {
		st := cep.Status
		if st.ID != int64(ph.ID) || st.ExternalIdentifiers == nil || st.Networking == nil || len(st.Networking.Addressing) == 0 {
			continue
		}
		pod, _, ok := m.pods.Get(txn, k8stables.NameIndex[*corev1.Pod]().Query(st.ExternalIdentifiers.PodName))
		if !ok || !ownedBy(cep, pod) {
			continue // another node's endpoint with the same ID, or a stale CEP
		}
		ip, err := netip.ParseAddr(st.Networking.Addressing[0].IPV4)
		if err != nil {
			continue
		}
		cid := st.ExternalIdentifiers.ContainerID
		_, ifName, _ := strings.Cut(st.ExternalIdentifiers.CNIAttachmentID, ":")
		if ifName == "" {
			ifName = "eth0"
		}
		ep := &endpoints.Endpoint{
			ID: ph.ID, ContainerID: cid, ContainerIfName: ifName,
			PodNamespace: pod.Namespace, PodName: pod.Name, PodUID: string(pod.UID),
			CEPNamespace: cep.Namespace, CEPName: cep.Name,
			HostIfName: hostLinkByAlias(m.sysClassNet, cid, ifName),
			IPv4:       ip, ServiceAccount: pod.Spec.ServiceAccountName, NamedPorts: namedPorts(pod),
			Labels: ph.Labels, State: ph.State, Log: ph.Log, Created: ph.Created,
		}
		ep.Labels, ep.InfoLabels = m.podLabels(txn, pod, pod.Namespace)
		ep.PolicyRestored = true
		return ep.WithState(ciliumv2.EndpointStateRestoring,
			"Rebuilt from CiliumEndpoint "+cep.Namespace+"/"+cep.Name+" after its state file was found unreadable", m.now()), ""
	}
	return nil, "no CiliumEndpoint with this ID belongs to a pod of this node"
}

func ownedBy(cep *ciliumv2.CiliumEndpoint, pod *corev1.Pod) bool {
	for _, ref := range cep.OwnerReferences {
		if ref.Kind == "Pod" && ref.UID == pod.UID {
			return true
		}
	}
	return false
}

// hostLinkByAlias finds the host link whose alias (IFLA_IFALIAS, set by
// the datapath as "cellium:<container ID>/<interface>") names the
// attachment, by reading sysfs; "" if none.
func hostLinkByAlias(sysClassNet, containerID, ifName string) string {
	if sysClassNet == "" || containerID == "" {
		return ""
	}
	want := "cellium:" + containerID + "/" + ifName
	links, err := os.ReadDir(sysClassNet)
	if err != nil {
		return ""
	}
	for _, l := range links {
		alias, err := os.ReadFile(filepath.Join(sysClassNet, l.Name(), "ifalias"))
		if err == nil && strings.TrimSpace(string(alias)) == want {
			return l.Name()
		}
	}
	return ""
}

// validateRestored decides about the restored endpoints in two steps, so
// that a boot with the API server down still serves them at once.
//
// First, with what the node knows: an endpoint whose host interface is
// gone is removed; the others claim their IPs again and resolve the
// identity of their saved labels (the allocator hands out the restored
// number while the cluster's identities are not listed); then done marks
// the endpoints table initialized (the CNI configuration is written, CNI
// DEL was served all along).
//
// Then, once the pods of this node are listed: endpoints whose pod is gone,
// re-created or moved are removed and their IPs released, placeholders are
// rebuilt, and the others take their pod's current labels.
func (m *Manager) validateRestored(ctx context.Context, restored []*endpoints.Endpoint, done func(statedb.WriteTxn)) error {
	markDone := sync.OnceFunc(func() {
		txn := m.db.WriteTxn(m.table)
		done(txn)
		txn.Commit()
	})
	defer markDone()
	if len(restored) == 0 {
		return nil
	}
	var local []*endpoints.Endpoint
	for _, ep := range restored {
		if isPlaceholder(ep) {
			continue // rebuilt from the CEP and the pod, later
		}
		if why := m.interfaceGone(ep); why != "" {
			m.log.Info("discarding restored endpoint", "endpoint", ep.ID, "pod", ep.PodKey(), "reason", why)
			m.remove(ctx, ep, true)
			continue
		}
		// IPAM holds the address since the start (HoldForRestore); a CNI
		// DEL that ran meanwhile released it, and the claim fails.
		if err := m.claimIP(ctx, ep.IPv4, ipam.Owner{Name: ep.PodKey(), ContainerID: ep.ContainerID}); err != nil {
			if m.remove(ctx, ep, false) {
				m.log.Warn("restored endpoint's IP cannot be claimed; discarding it", "endpoint", ep.ID, "ip", ep.IPv4, "error", err)
			}
			continue
		}
		local = append(local, ep)
	}
	// Bounded, for all endpoints together: without the API an identity
	// that was not restored waits for it; the second step resolves it
	// again once the pods are listed.
	rctx, cancel := context.WithTimeout(ctx, RestoreIdentityWait)
	for _, ep := range local {
		cur, ok := m.Get(ep.ID)
		if !ok || !sameEndpoint(cur, ep) {
			continue // deleted by a CNI DEL meanwhile
		}
		saved := cur.Labels
		if _, err := m.relabel(rctx, cur, &saved, true); err != nil {
			m.log.Warn("restored endpoint's identity not resolved yet; it stays restoring", "endpoint", ep.ID, "error", err)
		}
	}
	cancel()
	// Only now: the ipcache and the BPF loader prune what the initialized
	// table does not want, and a restored endpoint without its identity
	// yet wants no ipcache entry and no programs.
	markDone()

	if !m.labelSourcesSynced(m.db.ReadTxn()) {
		m.log.Info("restored endpoints serve with their saved labels until the pods of this node and the namespaces are listed", "count", len(local))
		if err := tables.WaitInitialized(ctx, m.db, m.pods, m.namespaces); err != nil {
			return err
		}
	}
	kept, stuck := 0, 0
	for _, ep := range restored {
		if isPlaceholder(ep) {
			if ep = m.rebuildPlaceholder(ep); ep == nil {
				continue
			}
			if why := m.interfaceGone(ep); why != "" {
				m.log.Info("discarding rebuilt endpoint", "endpoint", ep.ID, "pod", ep.PodKey(), "reason", why)
				m.remove(ctx, ep, true)
				continue
			}
			if err := m.claimIP(ctx, ep.IPv4, ipam.Owner{Name: ep.PodKey(), ContainerID: ep.ContainerID}); err != nil {
				if m.remove(ctx, ep, false) {
					m.log.Warn("rebuilt endpoint's IP cannot be claimed; discarding it", "endpoint", ep.ID, "ip", ep.IPv4, "error", err)
				}
				continue
			}
		}
		cur, ok := m.Get(ep.ID)
		if !ok || !sameEndpoint(cur, ep) {
			continue // removed above, or deleted by a CNI DEL meanwhile
		}
		if why := m.invalidReason(cur); why != "" {
			m.log.Info("discarding restored endpoint", "endpoint", ep.ID, "pod", ep.PodKey(), "reason", why)
			m.remove(ctx, cur, true)
			continue
		}
		// The pod's current labels; force when the identity is not
		// resolved yet.
		if _, err := m.relabel(ctx, cur, nil, !cur.InService()); err != nil {
			m.log.Warn("restored endpoint's identity not resolved yet; it stays restoring", "endpoint", ep.ID, "error", err)
			stuck++
			continue
		}
		kept++
	}
	m.log.Info("endpoint restore done", "restored", kept, "stuck", stuck, "discarded", len(restored)-kept-stuck)
	return nil
}

// rebuildPlaceholder replaces a placeholder by its rebuilt endpoint, or
// adds to its log why it could not be rebuilt and returns nil. A
// placeholder is never saved: the quarantined file keeps its ID reserved
// across restarts.
func (m *Manager) rebuildPlaceholder(ph *endpoints.Endpoint) *endpoints.Endpoint {
	rebuilt, why := m.rebuild(ph, m.ceps)
	if rebuilt == nil {
		txn := m.db.WriteTxn(m.table)
		defer txn.Commit()
		cur, _, ok := m.table.Get(txn, endpoints.IDIndex.Query(ph.ID))
		if !ok || !isPlaceholder(cur) || len(cur.Log) == 0 {
			return nil
		}
		msg := cur.Log[len(cur.Log)-1].Message
		if i := strings.Index(msg, ". If the pod"); i >= 0 && !strings.Contains(msg, "; not rebuilt: ") {
			if _, _, err := m.table.Insert(txn, cur.WithFailure(msg[:i]+"; not rebuilt: "+why+msg[i:], m.now())); err != nil {
				m.log.Warn("record why an endpoint was not rebuilt", "endpoint", ph.ID, "error", err)
			}
		}
		m.log.Warn("endpoint with an unreadable state file not rebuilt; its ID stays reserved", "endpoint", ph.ID, "reason", why)
		return nil
	}
	err := m.modify(ph.ID, func(cur *endpoints.Endpoint) *endpoints.Endpoint {
		if !isPlaceholder(cur) {
			rebuilt = nil
			return nil
		}
		return rebuilt
	})
	if err != nil || rebuilt == nil {
		m.log.Warn("rebuild endpoint", "endpoint", ph.ID, "error", err)
		return nil
	}
	m.log.Info("rebuilt endpoint from its CiliumEndpoint", "endpoint", rebuilt.ID, "pod", rebuilt.PodKey(), "ip", rebuilt.IPv4, "hostInterface", rebuilt.HostIfName)
	return rebuilt
}

// interfaceGone says why a restored endpoint's host interface is gone, or "".
func (m *Manager) interfaceGone(ep *endpoints.Endpoint) string {
	if ep.HostIfName != "" {
		if _, err := net.InterfaceByName(ep.HostIfName); err != nil {
			return "host interface " + ep.HostIfName + " is gone"
		}
	}
	return ""
}

// invalidReason says why a restored endpoint cannot be kept, or "".
func (m *Manager) invalidReason(ep *endpoints.Endpoint) string {
	if why := m.interfaceGone(ep); why != "" {
		return why
	}
	if ep.PodName == "" {
		return ""
	}
	pod, _, ok := m.pods.Get(m.db.ReadTxn(), k8stables.NameIndex[*corev1.Pod]().Query(ep.PodKey()))
	switch {
	case !ok:
		return "pod " + ep.PodKey() + " no longer exists on this node"
	case ep.PodUID != "" && string(pod.UID) != ep.PodUID:
		return "pod " + ep.PodKey() + " was re-created (UID " + string(pod.UID) + ")"
	case pod.Spec.NodeName != string(m.node):
		return "pod " + ep.PodKey() + " is scheduled to node " + pod.Spec.NodeName
	}
	return ""
}
