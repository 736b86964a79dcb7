package nodediscovery

import (
	"context"
	"fmt"
	"iter"
	"maps"
	"slices"

	"github.com/cilium/statedb"
	"k8s.io/apimachinery/pkg/api/equality"
	k8serrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	ciliumclient "github.com/cellium/cellium/api/client/clientset/versioned/typed/cilium.io/v2"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/statedb/nodes"
)

// applyLocalNode sets on cn the fields the agent owns, from n, and reports
// whether cn changed. Everything else is left as it is, in particular
// spec.ipam (the operator's podCIDRs), status, and labels, annotations and
// ownerReferences that others added:
//
//   - metadata.labels and annotations: the Node's are set (merged: keys
//     others added stay);
//   - metadata.ownerReferences: one reference to the Node (for garbage
//     collection when the Node is deleted); others stay;
//   - spec.addresses: the Node's InternalIP and ExternalIP addresses, then
//     the CiliumInternalIP (router IP); an existing CiliumInternalIP is kept
//     while the agent does not know its own yet;
//   - spec.health.ipv4, once allocated; spec.bootid.
//
// spec.instance-id is a cloud instance ID that Cilium sets only in cloud
// IPAM modes; in cluster-pool mode it is left alone.
func applyLocalNode(cn *ciliumv2.CiliumNode, n *nodes.LocalNode) bool {
	before := cn.DeepCopy()
	cn.Name = n.Name
	cn.Labels = merged(cn.Labels, n.Labels)
	cn.Annotations = merged(cn.Annotations, n.Annotations)
	if n.UID != "" {
		ref := metav1.OwnerReference{APIVersion: "v1", Kind: "Node", Name: n.Name, UID: types.UID(n.UID)}
		i := slices.IndexFunc(cn.OwnerReferences, func(r metav1.OwnerReference) bool {
			return r.APIVersion == "v1" && r.Kind == "Node"
		})
		if i >= 0 {
			cn.OwnerReferences[i] = ref
		} else {
			cn.OwnerReferences = append(cn.OwnerReferences, ref)
		}
	}

	addrs := make([]ciliumv2.NodeAddress, 0, len(n.NodeAddresses)+1)
	for _, a := range n.NodeAddresses {
		addrs = append(addrs, ciliumv2.NodeAddress{Type: ciliumv2.AddressType(a.Type), IP: a.IP.String()})
	}
	if n.RouterIP.IsValid() {
		addrs = append(addrs, ciliumv2.NodeAddress{Type: ciliumv2.NodeCiliumInternalIP, IP: n.RouterIP.String()})
	} else {
		for _, a := range cn.Spec.Addresses {
			if a.Type == ciliumv2.NodeCiliumInternalIP {
				addrs = append(addrs, a)
			}
		}
	}
	cn.Spec.Addresses = addrs
	if n.HealthIPv4.IsValid() {
		cn.Spec.HealthAddressing.IPv4 = n.HealthIPv4.String()
	}
	if n.BootID != "" {
		cn.Spec.BootID = n.BootID
	}
	return !equality.Semantic.DeepEqual(before, cn)
}

// merged returns dst with every key of src set to src's value; dst is
// not modified. nil when both are empty.
func merged(dst, src map[string]string) map[string]string {
	if len(src) == 0 {
		return dst
	}
	out := maps.Clone(dst)
	if out == nil {
		out = make(map[string]string, len(src))
	}
	maps.Copy(out, src)
	return out
}

// upToDate reports whether cn already carries n's fields.
func upToDate(cn *ciliumv2.CiliumNode, n *nodes.LocalNode) bool {
	if cn == nil {
		return false
	}
	return !applyLocalNode(cn.DeepCopy(), n)
}

// ciliumNodeTarget is the reconciler's target: the local node's
// CiliumNode in the API server.
type ciliumNodeTarget struct {
	cs k8s.Clientset
}

func (t *ciliumNodeTarget) client() ciliumclient.CiliumNodeInterface {
	return t.cs.Cilium().CiliumV2().CiliumNodes()
}

// Update creates the CiliumNode if missing, else updates it when the
// agent's fields differ. Conflicts with other writers (the operator
// writing podCIDRs) are retried at once with a fresh GET; other errors are
// retried by the reconciler with backoff.
func (t *ciliumNodeTarget) Update(ctx context.Context, _ statedb.ReadTxn, n *nodes.LocalNode) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := t.client().Get(ctx, n.Name, metav1.GetOptions{})
		if k8serrors.IsNotFound(err) {
			cn := &ciliumv2.CiliumNode{ObjectMeta: metav1.ObjectMeta{Name: n.Name}}
			applyLocalNode(cn, n)
			if _, err := t.client().Create(ctx, cn, metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("create CiliumNode %s: %w", n.Name, err)
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("get CiliumNode %s: %w", n.Name, err)
		}
		upd := cur.DeepCopy()
		if !applyLocalNode(upd, n) {
			return nil
		}
		if _, err := t.client().Update(ctx, upd, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("update CiliumNode %s: %w", n.Name, err)
		}
		return nil
	})
}

// Delete does nothing: the agent never deletes its CiliumNode (the
// ownerReference to the Node lets Kubernetes remove it with the node).
func (t *ciliumNodeTarget) Delete(context.Context, statedb.ReadTxn, *nodes.LocalNode) error {
	return nil
}

// Prune does nothing: the other CiliumNodes belong to other agents.
func (t *ciliumNodeTarget) Prune(context.Context, statedb.ReadTxn, iter.Seq2[*nodes.LocalNode, statedb.Revision]) error {
	return nil
}
