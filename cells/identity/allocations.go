package identity

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"maps"
	"time"

	"github.com/cilium/statedb"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	ciliumv2client "github.com/cellium/cellium/api/client/clientset/versioned/typed/cilium.io/v2"
	"github.com/cellium/cellium/statedb/identity"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/labels"
	"github.com/cellium/cellium/statedb/reconciler"
)

// newCiliumIdentity is the object for id and lbls: named by the number,
// security-labels keyed "source:key", and the Kubernetes-sourced labels
// copied into metadata.labels so that `kubectl get ciliumid -l app=web`
// finds it (see metadataLabels).
func newCiliumIdentity(id identity.NumericIdentity, lbls labels.Labels) *ciliumv2.CiliumIdentity {
	return &ciliumv2.CiliumIdentity{
		ObjectMeta:     metav1.ObjectMeta{Name: id.StringID(), Labels: metadataLabels(lbls)},
		SecurityLabels: lbls.Map(),
	}
}

// metadataLabels selects the security labels a CiliumIdentity carries as
// its Kubernetes labels: those of source k8s, keyed without the source
// ("k8s:app" becomes "app", "k8s:io.kubernetes.pod.namespace" stays
// "io.kubernetes.pod.namespace"). A label whose key is not a valid
// Kubernetes label key (prefix/name) or whose value is not a valid label
// value (63 characters of [A-Za-z0-9-_.], alphanumeric at both ends) is
// left out: such labels stay in security-labels, which is what identity
// matching uses, and are only not selectable with -l. nil when none.
func metadataLabels(lbls labels.Labels) map[string]string {
	var out map[string]string
	for l := range lbls.All() {
		if l.Source != labels.SourceK8s ||
			len(validation.IsQualifiedName(l.Key)) != 0 || len(validation.IsValidLabelValue(l.Value)) != 0 {
			continue
		}
		if out == nil {
			out = map[string]string{}
		}
		out[l.Key] = l.Value
	}
	return out
}

// labelsKey is the SortedList of an object's security labels.
func labelsKey(obj *ciliumv2.CiliumIdentity) string {
	return labels.FromMap(obj.SecurityLabels, "").SortedList()
}

func marked(obj *ciliumv2.CiliumIdentity) bool {
	_, ok := obj.Annotations[ciliumv2.HeartbeatAnnotation]
	return ok
}

// identityOps keeps the CiliumIdentity of each allocation in the API.
// Delete does nothing: unused identities are the operator's to delete.
type identityOps struct {
	log *slog.Logger
	// cids mirrors the objects; nil when the CiliumIdentity table is fed
	// from etcd (doublewrite-readkvstore): the objects are then read from
	// the API server.
	cids   statedb.Table[*ciliumv2.CiliumIdentity]
	client ciliumv2client.CiliumIdentityInterface
}

// Update makes sure the identity exists with the allocation's labels and
// carries no heartbeat mark. It reads the mirrored table first, so the
// usual case costs no API call.
func (o *identityOps) Update(ctx context.Context, txn statedb.ReadTxn, a *identity.Allocation) error {
	if o.client == nil {
		return errNoClient
	}
	name := a.ID.StringID()
	key := a.Labels.SortedList()
	var (
		obj   *ciliumv2.CiliumIdentity
		found bool
	)
	if o.cids != nil {
		obj, _, found = o.cids.Get(txn, k8stables.NameIndex[*ciliumv2.CiliumIdentity]().Query(name))
	} else {
		cur, err := o.client.Get(ctx, name, metav1.GetOptions{})
		switch {
		case err == nil:
			obj, found = cur, true
		case !apierrors.IsNotFound(err):
			return fmt.Errorf("get CiliumIdentity %s: %w", name, err)
		}
	}
	if !found {
		// Gone (the operator's GC raced with a new user, or someone deleted
		// it): put it back with the same number and labels.
		_, err := o.client.Create(ctx, newCiliumIdentity(a.ID, a.Labels), metav1.CreateOptions{})
		if err == nil {
			o.log.Info("Re-created CiliumIdentity that was deleted while in use", "identity", a.ID, "labels", a.Labels)
			return nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("re-create CiliumIdentity %s: %w", name, err)
		}
		if obj, err = o.client.Get(ctx, name, metav1.GetOptions{}); err != nil {
			return fmt.Errorf("get CiliumIdentity %s: %w", name, err)
		}
	}
	if labelsKey(obj) != key {
		return fmt.Errorf("CiliumIdentity %s has labels %v, want %v: %w",
			name, labels.FromMap(obj.SecurityLabels, ""), a.Labels, ErrIdentityConflict)
	}
	missing := missingLabels(obj.Labels, metadataLabels(a.Labels))
	if !marked(obj) && len(missing) == 0 {
		return nil
	}
	// Removing the mark changes the resourceVersion, so the operator's
	// delete, which is conditional on the version it marked, fails. An
	// identity written by Cilium (or an older cellium) gets its security
	// labels as metadata labels on the way, for kubectl get -l.
	c := obj.DeepCopy()
	delete(c.Annotations, ciliumv2.HeartbeatAnnotation)
	if len(missing) > 0 && c.Labels == nil {
		c.Labels = map[string]string{}
	}
	maps.Copy(c.Labels, missing)
	if _, err := o.client.Update(ctx, c, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update CiliumIdentity %s (heartbeat mark, labels): %w", name, err)
	}
	return nil
}

// missingLabels returns the entries of want that have is lacks or holds
// with another value.
func missingLabels(have, want map[string]string) map[string]string {
	var out map[string]string
	for k, v := range want {
		if cur, ok := have[k]; !ok || cur != v {
			if out == nil {
				out = map[string]string{}
			}
			out[k] = v
		}
	}
	return out
}

// Delete leaves the object alone: other agents may use it, and the
// operator's identity GC deletes it once nobody does.
func (o *identityOps) Delete(context.Context, statedb.ReadTxn, *identity.Allocation) error {
	return nil
}

// Prune deletes nothing, for the same reason.
func (o *identityOps) Prune(context.Context, statedb.ReadTxn, iter.Seq2[*identity.Allocation, statedb.Revision]) error {
	return nil
}

// fullReconcileInterval is how often every allocation is checked against
// the table again, in case a change was missed.
const fullReconcileInterval = 5 * time.Minute

// doubleWriteOps keeps each allocation in both backends (the double-write
// modes): etcd's master and value keys, and the CiliumIdentity object.
// An error of either is returned, so that the reconciler retries until
// both hold it.
type doubleWriteOps struct {
	kv, crd reconciler.Operations[*identity.Allocation]
}

// Update writes the allocation to both backends.
func (o doubleWriteOps) Update(ctx context.Context, txn statedb.ReadTxn, a *identity.Allocation) error {
	return errors.Join(o.kv.Update(ctx, txn, a), o.crd.Update(ctx, txn, a))
}

// Delete removes this node's use from both (the object stays: the
// operator's GC deletes it).
func (o doubleWriteOps) Delete(ctx context.Context, txn statedb.ReadTxn, a *identity.Allocation) error {
	return errors.Join(o.kv.Delete(ctx, txn, a), o.crd.Delete(ctx, txn, a))
}

// Prune prunes both.
func (o doubleWriteOps) Prune(ctx context.Context, txn statedb.ReadTxn, objs iter.Seq2[*identity.Allocation, statedb.Revision]) error {
	return errors.Join(o.kv.Prune(ctx, txn, objs), o.crd.Prune(ctx, txn, objs))
}
