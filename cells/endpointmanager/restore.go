package endpointmanager

import (
	"context"
	"fmt"
	"net"

	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/identity"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/tables"
)

// loadRestored reads the saved endpoints into the table in state
// restoring, keeping their IDs. It runs in the start hook, before the API
// serves, so that a CNI DEL for a restored endpoint finds it.
func (m *Manager) loadRestored() ([]*endpoints.Endpoint, error) {
	saved, errs := m.store.load()
	for _, err := range errs {
		m.log.Warn("skipping unreadable endpoint state", "error", err)
	}
	txn := m.db.WriteTxn(m.table)
	defer txn.Abort()
	var restored []*endpoints.Endpoint
	for _, ep := range saved {
		if ep.Health {
			_ = m.store.remove(ep.ID) // the health endpoint is made anew
			continue
		}
		ep = ep.WithState(ciliumv2.EndpointStateRestoring, "Restoring endpoint after agent restart", m.now())
		// This process holds no reference to the old identity yet: the
		// endpoint gets one when restore resolves its labels again.
		ep.Identity = identity.InvalidIdentity
		if _, _, err := m.table.Insert(txn, ep); err != nil {
			return nil, fmt.Errorf("restore endpoint %d: %w", ep.ID, err)
		}
		restored = append(restored, ep)
		m.nextID = max(m.nextID, ep.ID)
	}
	txn.Commit()
	if len(restored) > 0 {
		m.log.Info("restoring endpoints", "count", len(restored))
	}
	return restored, nil
}

// validateRestored keeps the restored endpoints whose pod still exists on
// this node with the same UID and whose host interface still exists:
// their IPs are claimed again and their identities resolved; they become
// ready without touching their interfaces. The others are removed and
// their IPs released. done marks the endpoints table initialized.
func (m *Manager) validateRestored(ctx context.Context, restored []*endpoints.Endpoint, done func(statedb.WriteTxn)) error {
	defer func() {
		txn := m.db.WriteTxn(m.table)
		done(txn)
		txn.Commit()
	}()
	if len(restored) == 0 {
		return nil
	}
	if err := tables.WaitInitialized(ctx, m.db, m.pods); err != nil {
		return err
	}
	kept := 0
	for _, ep := range restored {
		if why := m.invalidReason(ep); why != "" {
			m.log.Info("discarding restored endpoint", "endpoint", ep.ID, "pod", ep.PodKey(), "reason", why)
			m.remove(ctx, ep, true)
			continue
		}
		if _, err := m.ipam.AllocateIP(ctx, ep.IPv4, ep.PodKey()); err != nil {
			m.log.Warn("restored endpoint's IP cannot be claimed; discarding it", "endpoint", ep.ID, "ip", ep.IPv4, "error", err)
			m.remove(ctx, ep, false)
			continue
		}
		cur, ok := m.Get(ep.ID)
		if !ok {
			continue // deleted by a CNI DEL meanwhile
		}
		if _, err := m.relabel(ctx, cur, nil, true); err != nil {
			m.log.Warn("restored endpoint's identity not resolved yet; it stays restoring", "endpoint", ep.ID, "error", err)
			continue
		}
		kept++
	}
	m.log.Info("endpoint restore done", "restored", kept, "discarded", len(restored)-kept)
	return nil
}

// invalidReason says why a restored endpoint cannot be kept, or "".
func (m *Manager) invalidReason(ep *endpoints.Endpoint) string {
	if ep.HostIfName != "" {
		if _, err := net.InterfaceByName(ep.HostIfName); err != nil {
			return "host interface " + ep.HostIfName + " is gone"
		}
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
