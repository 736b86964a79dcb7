package cepsync

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"
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
	// pods tells whether the pod of a deleted endpoint is going away, so
	// that its CEP can be left to the garbage collector.
	pods statedb.Table[*corev1.Pod]
	// gcGrace is how long a CEP left to the garbage collector may
	// outlive its endpoint before the agent deletes it itself.
	gcGrace time.Duration
	now     func() time.Time

	// writeMu serializes Update, Delete and sweepOrphans: a sweep never
	// deletes an orphan that an Update is adopting.
	writeMu sync.Mutex

	mu   sync.Mutex
	uids map[string]types.UID // "ns/name" -> UID of the CEP we own
	// pods is the pod UID each owned CEP was written for: a pod re-created
	// under the same name needs a new CEP (owner reference), not a patch.
	podUIDs map[string]string
	// orphans are the CEPs of deleted endpoints not deleted yet: left to
	// the garbage collector, or to sweepOrphans.
	orphans map[string]orphan
}

// orphan is a CEP of ours whose endpoint was deleted (see Delete): the
// garbage collector deletes it once its owner pod is gone (its
// ownerReference), or sweepOrphans does.
type orphan struct {
	uid             types.UID
	podName, podUID string
	since           time.Time
	// seen says the CEP was in the agent's CEP table since it became an
	// orphan: its absence from the table then means it was deleted. In
	// slice mode a young CEP may not be in any slice yet: its absence
	// means nothing, and only the API server can tell.
	seen bool
}

// owned records that the CEP key (UID cep) is ours, written for pod UID pod.
func (t *target) owned(key string, cep types.UID, pod string) {
	t.setUID(key, cep)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.podUIDs == nil {
		t.podUIDs = map[string]string{}
	}
	t.podUIDs[key] = pod
}

// podUID is the pod UID the owned CEP key was written for.
func (t *target) podUID(key string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.podUIDs[key]
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
		delete(t.podUIDs, key)
	} else {
		t.uids[key] = u
	}
}

// Update creates, adopts or patches the CEP.
func (t *target) Update(ctx context.Context, _ statedb.ReadTxn, d *DesiredCEP) error {
	t.writeMu.Lock()
	defer t.writeMu.Unlock()
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
	if _, _, mirrored := t.ceps.Get(t.db.ReadTxn(), k8stables.NameIndex[*ciliumv2.CiliumEndpoint]().Query(key)); !mirrored {
		// The usual case, a new pod: create at once, without reading
		// first (the mirror would show a CEP of that name).
		err := t.create(ctx, d)
		if !k8serrors.IsAlreadyExists(err) {
			return err
		}
	}
	cur, err := api.Get(ctx, d.Name, metav1.GetOptions{})
	switch {
	case k8serrors.IsNotFound(err):
		return t.create(ctx, d)
	case err != nil:
		return fmt.Errorf("get CiliumEndpoint %s: %w", key, err)
	}
	if o, ok := t.orphan(key); ok && o.uid == cur.UID {
		if o.podUID != d.PodUID {
			// Our CEP of the pod's previous life (a pod re-created under
			// the same name), left to the garbage collector, which has
			// not come yet: the new pod's replaces it now.
			if err := t.deleteUID(ctx, d.Namespace, d.Name, cur.UID); err != nil {
				return err
			}
			t.forgetOrphan(key, cur.UID)
			return t.create(ctx, d)
		}
		// The same pod's new endpoint (a new sandbox): adopted below.
		t.forgetOrphan(key, cur.UID)
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

// create creates d's CEP and records it as ours. An error wraps the API
// server's (k8serrors.IsAlreadyExists works on it).
func (t *target) create(ctx context.Context, d *DesiredCEP) error {
	created, err := t.client.CiliumV2().CiliumEndpoints(d.Namespace).Create(ctx, t.newCEP(d), metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create CiliumEndpoint %s: %w", d.Key(), err)
	}
	t.owned(d.Key(), created.UID, d.PodUID)
	return nil
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

// Delete deletes the CEP if it is the one we own. A CEP we own that has
// an owner pod is handed to sweepOrphans instead: if the pod is gone or
// terminating, the garbage collector deletes the CEP (its ownerReference
// names the pod) once the pod is gone, and the agent does not write at
// all, unless the collector has not within gcGrace (a cluster without
// one); if the pod lives on (a finished pod, a sandbox that went), the
// agent deletes the CEP a moment later, once its pods table had the
// time to show the pod's deletion.
func (t *target) Delete(ctx context.Context, _ statedb.ReadTxn, d *DesiredCEP) error {
	t.writeMu.Lock()
	defer t.writeMu.Unlock()
	key := d.Key()
	uid, known := t.uid(key)
	if known && d.PodUID != "" {
		t.mu.Lock()
		if t.orphans == nil {
			t.orphans = map[string]orphan{}
		}
		_, _, seen := t.ceps.Get(t.db.ReadTxn(), k8stables.NameIndex[*ciliumv2.CiliumEndpoint]().Query(key))
		t.orphans[key] = orphan{uid: uid, podName: d.PodName, podUID: d.PodUID, since: t.clock(), seen: seen}
		t.mu.Unlock()
		t.setUID(key, "")
		return nil
	}
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

// podGoing reports whether the owner pod of the orphan key is gone from
// the pods table, replaced by another of the same name, or terminating:
// the garbage collector then deletes the CEP once the pod is gone.
func (t *target) podGoing(rtxn statedb.ReadTxn, key string, o orphan) bool {
	if t.pods == nil {
		return true
	}
	ns, _, _ := strings.Cut(key, "/")
	pod, _, ok := t.pods.Get(rtxn, k8stables.NameIndex[*corev1.Pod]().Query(ns+"/"+o.podName))
	return !ok || string(pod.UID) != o.podUID || pod.DeletionTimestamp != nil
}

func (t *target) clock() time.Time {
	if t.now == nil {
		return time.Now()
	}
	return t.now()
}

func (t *target) orphan(key string) (orphan, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	o, ok := t.orphans[key]
	return o, ok
}

// markSeen records that the orphan key (the CEP uid) is in the CEP table.
func (t *target) markSeen(key string, uid types.UID) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if o, ok := t.orphans[key]; ok && o.uid == uid {
		o.seen = true
		t.orphans[key] = o
	}
}

// forgetOrphan forgets the orphan key if it is the CEP uid.
func (t *target) forgetOrphan(key string, uid types.UID) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if o, ok := t.orphans[key]; ok && o.uid == uid {
		delete(t.orphans, key)
	}
}

// aliveGrace is how long a CEP whose endpoint went is kept while its pod
// looks alive: the agent's pods table may show the pod's deletion a
// moment after the endpoint's (the CNI DEL follows it closely).
const aliveGrace = time.Second

// leftToGC reports whether cep is an orphan whose grace has not passed
// (sweepOrphans deletes it then if need be, not Prune).
func (t *target) leftToGC(cep *ciliumv2.CiliumEndpoint) bool {
	o, ok := t.orphan(cep.Namespace + "/" + cep.Name)
	return ok && (cep.UID == "" || cep.UID == o.uid) && t.clock().Sub(o.since) < t.gcGrace
}

// sweepOrphans forgets the orphans the garbage collector deleted and
// deletes those it has not after gcGrace (by UID: never a CEP created
// since). The CEP mirror says which are gone; a CEP rebuilt from a slice
// (no UID), or not in the mirror since it became an orphan (in slice mode,
// a CEP deleted before the operator put it in a slice), is read before it
// is deleted.
func (t *target) sweepOrphans(ctx context.Context) error {
	t.writeMu.Lock()
	defer t.writeMu.Unlock()
	t.mu.Lock()
	due := map[string]orphan{}
	for key, o := range t.orphans {
		due[key] = o
	}
	t.mu.Unlock()
	rtxn := t.db.ReadTxn()
	now := t.clock()
	var errs []error
	for key, o := range due {
		cur, _, ok := t.ceps.Get(rtxn, k8stables.NameIndex[*ciliumv2.CiliumEndpoint]().Query(key))
		switch {
		case ok && !o.seen:
			t.markSeen(key, o.uid)
		case !ok && !o.seen:
			// Never in the table: in slice mode, its slice may not be
			// written yet. Treated as present, and read before deleting.
			cur = &ciliumv2.CiliumEndpoint{}
		}
		if !ok && o.seen || cur.UID != "" && cur.UID != o.uid {
			t.forgetOrphan(key, o.uid) // the collector (or someone) deleted it
			continue
		}
		switch age := now.Sub(o.since); {
		case age < aliveGrace:
			continue // the pods table may not show the pod's deletion yet
		case age < t.gcGrace && t.podGoing(rtxn, key, o):
			continue // the garbage collector's
		}
		ns, name, _ := strings.Cut(key, "/")
		if cur.UID == "" {
			real, err := t.client.CiliumV2().CiliumEndpoints(ns).Get(ctx, name, metav1.GetOptions{})
			if k8serrors.IsNotFound(err) || err == nil && real.UID != o.uid {
				t.forgetOrphan(key, o.uid)
				continue
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("get CiliumEndpoint %s: %w", key, err))
				continue
			}
		}
		t.log.Debug("deleting the CiliumEndpoint of a deleted endpoint", "cep", key, "uid", o.uid, "after", now.Sub(o.since).Round(time.Millisecond))
		if err := t.deleteUID(ctx, ns, name, o.uid); err != nil {
			errs = append(errs, err)
			continue
		}
		t.forgetOrphan(key, o.uid)
	}
	return errors.Join(errs...)
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
		if statusNode(cep) == nodeIP && !want[key] && cep.Name != t.healthName && !t.pending(rtxn, cep) && !t.leftToGC(cep) {
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
