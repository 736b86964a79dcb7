package cepsync

import (
	"context"
	"encoding/json"
	"fmt"
	"iter"
	"log/slog"
	"sync"

	"github.com/cilium/statedb"
	"k8s.io/apimachinery/pkg/api/equality"
	k8serrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/client/clientset/versioned"
	"github.com/cellium/cellium/statedb/endpoints"
	k8stables "github.com/cellium/cellium/statedb/k8s"
)

// target applies desired CEPs to the API server. It remembers the UID of
// every CEP it created or adopted; updates are JSON patches that first test
// that UID, so a CEP replaced behind its back is never overwritten.
type target struct {
	log    *slog.Logger
	client versioned.Interface
	db     *statedb.DB
	ceps   statedb.Table[*ciliumv2.CiliumEndpoint]
	nodeIP func() string
	// healthName is this node's health CEP, never pruned.
	healthName string
	// endpoints keeps the CEPs of endpoints that exist but have no
	// desired CEP yet (restored, stuck) from being pruned.
	endpoints statedb.Table[*endpoints.Endpoint]

	mu   sync.Mutex
	uids map[string]types.UID // "ns/name" -> UID of the CEP we own
	// pods is the pod UID each owned CEP was written for: a pod re-created
	// under the same name needs a new CEP (owner reference), not a patch.
	pods map[string]string
}

// owned records that the CEP key (UID cep) is ours, written for pod UID pod.
func (t *target) owned(key string, cep types.UID, pod string) {
	t.setUID(key, cep)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.pods == nil {
		t.pods = map[string]string{}
	}
	t.pods[key] = pod
}

// podUID is the pod UID the owned CEP key was written for.
func (t *target) podUID(key string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.pods[key]
}

func (t *target) uid(key string) (types.UID, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	u, ok := t.uids[key]
	return u, ok
}

func (t *target) setUID(key string, u types.UID) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if u == "" {
		delete(t.uids, key)
		delete(t.pods, key)
	} else {
		t.uids[key] = u
	}
}

// Update creates, adopts or patches the CEP.
func (t *target) Update(ctx context.Context, _ statedb.ReadTxn, d *DesiredCEP) error {
	key := d.Key()
	uid, known := t.uid(key)
	if known && t.podUID(key) != d.PodUID {
		// The pod was re-created under the same name: our CEP names the old
		// pod as owner. Delete it (only that UID) and create the new one.
		if err := t.deleteUID(ctx, d.Namespace, d.Name, uid); err != nil {
			return err
		}
		t.setUID(key, "")
		known = false
	}
	if known {
		// Skip identical writes: the mirror of the CEP already matches.
		if cur, _, ok := t.ceps.Get(t.db.ReadTxn(), k8stables.NameIndex[*ciliumv2.CiliumEndpoint]().Query(key)); ok &&
			cur.UID == uid && equality.Semantic.DeepEqual(cur.Status, d.Status) && equality.Semantic.DeepEqual(cur.Labels, d.Labels) {
			return nil
		}
		return t.patch(ctx, d, uid)
	}
	api := t.client.CiliumV2().CiliumEndpoints(d.Namespace)
	cur, err := api.Get(ctx, d.Name, metav1.GetOptions{})
	switch {
	case k8serrors.IsNotFound(err):
		created, err := api.Create(ctx, t.newCEP(d), metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create CiliumEndpoint %s: %w", key, err)
		}
		t.owned(key, created.UID, d.PodUID)
		return nil
	case err != nil:
		return fmt.Errorf("get CiliumEndpoint %s: %w", key, err)
	}
	if why := t.notOurs(cur, d); why != "" {
		return fmt.Errorf("CiliumEndpoint %s (UID %s) %s: not taking it over; retrying until it is deleted", key, cur.UID, why)
	}
	t.owned(key, cur.UID, d.PodUID)
	if equality.Semantic.DeepEqual(cur.Status, d.Status) && equality.Semantic.DeepEqual(cur.Labels, d.Labels) {
		return nil
	}
	return t.patch(ctx, d, cur.UID)
}

// notOurs says why an existing CEP may not be adopted, or "".
func (t *target) notOurs(cur *ciliumv2.CiliumEndpoint, d *DesiredCEP) string {
	if node := statusNode(cur); node != "" && node != t.nodeIP() {
		return "belongs to node " + node
	}
	var owner types.UID
	for _, ref := range cur.OwnerReferences {
		if ref.Kind == "Pod" {
			owner = ref.UID
		}
	}
	if string(owner) != d.PodUID {
		if owner == "" {
			return "has no pod owner"
		}
		return "belongs to pod UID " + string(owner)
	}
	return ""
}

func statusNode(c *ciliumv2.CiliumEndpoint) string {
	if c.Status.Networking == nil {
		return ""
	}
	return c.Status.Networking.NodeIP
}

func (t *target) newCEP(d *DesiredCEP) *ciliumv2.CiliumEndpoint {
	cep := &ciliumv2.CiliumEndpoint{
		ObjectMeta: metav1.ObjectMeta{Name: d.Name, Namespace: d.Namespace, Labels: d.Labels},
		Status:     d.Status,
	}
	if d.PodUID != "" {
		cep.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: d.PodName, UID: types.UID(d.PodUID)}}
	}
	return cep
}

type patchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value"`
}

// patch replaces the status (and labels) guarded by a test of the UID.
func (t *target) patch(ctx context.Context, d *DesiredCEP, uid types.UID) error {
	ops := []patchOp{
		{Op: "test", Path: "/metadata/uid", Value: uid},
		{Op: "replace", Path: "/status", Value: d.Status},
	}
	if d.Labels != nil {
		ops = append(ops, patchOp{Op: "add", Path: "/metadata/labels", Value: d.Labels})
	}
	body, err := json.Marshal(ops)
	if err != nil {
		return err
	}
	_, err = t.client.CiliumV2().CiliumEndpoints(d.Namespace).Patch(ctx, d.Name, types.JSONPatchType, body, metav1.PatchOptions{})
	if err != nil {
		// Gone, replaced or invalid: look again on the retry.
		t.setUID(d.Key(), "")
		return fmt.Errorf("patch CiliumEndpoint %s: %w", d.Key(), err)
	}
	return nil
}

// Delete deletes the CEP if it is the one we own.
func (t *target) Delete(ctx context.Context, _ statedb.ReadTxn, d *DesiredCEP) error {
	key := d.Key()
	uid, known := t.uid(key)
	if !known {
		cur, err := t.client.CiliumV2().CiliumEndpoints(d.Namespace).Get(ctx, d.Name, metav1.GetOptions{})
		if k8serrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("get CiliumEndpoint %s: %w", key, err)
		}
		if t.notOurs(cur, d) != "" {
			return nil // someone else's: leave it
		}
		uid = cur.UID
	}
	if err := t.deleteUID(ctx, d.Namespace, d.Name, uid); err != nil {
		return err
	}
	t.setUID(key, "")
	return nil
}

func (t *target) deleteUID(ctx context.Context, ns, name string, uid types.UID) error {
	err := t.client.CiliumV2().CiliumEndpoints(ns).Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !k8serrors.IsNotFound(err) && !k8serrors.IsConflict(err) {
		return fmt.Errorf("delete CiliumEndpoint %s/%s: %w", ns, name, err)
	}
	return nil
}

// pending reports whether cep belongs to a local endpoint that has no
// desired CEP (yet): a restored endpoint whose identity is not resolved,
// or the placeholder that holds the ID of an endpoint whose state file is
// unreadable (nothing but its ID is known, so its CEP is kept by ID).
func (t *target) pending(rtxn statedb.ReadTxn, cep *ciliumv2.CiliumEndpoint) bool {
	if t.endpoints == nil {
		return false
	}
	if _, _, ok := t.endpoints.Get(rtxn, endpoints.CEPIndex.Query(cep.Namespace+"/"+cep.Name)); ok {
		return true
	}
	if cep.Status.ID <= 0 || cep.Status.ID > 0xffff {
		return false
	}
	ep, _, ok := t.endpoints.Get(rtxn, endpoints.IDIndex.Query(uint16(cep.Status.ID)))
	return ok && ep.PodName == "" && !ep.Health
}

// Prune deletes CEPs of this node that match no desired CEP: the stale
// CEPs of endpoints that did not survive a restart.
func (t *target) Prune(ctx context.Context, _ statedb.ReadTxn, desired iter.Seq2[*DesiredCEP, statedb.Revision]) error {
	rtxn := t.db.ReadTxn()
	if ok, _ := t.ceps.Initialized(rtxn); !ok {
		return fmt.Errorf("CiliumEndpoints not synced yet")
	}
	nodeIP := t.nodeIP()
	if nodeIP == "" {
		return fmt.Errorf("node IP not known yet")
	}
	want := map[string]bool{}
	for d := range desired {
		want[d.Key()] = true
	}
	var stale []*ciliumv2.CiliumEndpoint
	for cep := range t.ceps.All(rtxn) {
		key := cep.Namespace + "/" + cep.Name
		if statusNode(cep) == nodeIP && !want[key] && cep.Name != t.healthName && !t.pending(rtxn, cep) {
			stale = append(stale, cep)
		}
	}
	for _, cep := range stale {
		if cep.UID == "" {
			// A CiliumEndpoint rebuilt from a CiliumEndpointSlice
			// (--enable-cilium-endpoint-slice) has no UID and only part of
			// its status: read the real one and check it again.
			real, err := t.client.CiliumV2().CiliumEndpoints(cep.Namespace).Get(ctx, cep.Name, metav1.GetOptions{})
			if k8serrors.IsNotFound(err) {
				continue
			}
			if err != nil {
				return fmt.Errorf("get CiliumEndpoint %s/%s: %w", cep.Namespace, cep.Name, err)
			}
			if statusNode(real) != nodeIP || t.pending(rtxn, real) {
				continue
			}
			cep = real
		}
		t.log.Info("deleting stale CiliumEndpoint of this node", "cep", cep.Namespace+"/"+cep.Name, "uid", cep.UID)
		if err := t.deleteUID(ctx, cep.Namespace, cep.Name, cep.UID); err != nil {
			return err
		}
	}
	return nil
}
