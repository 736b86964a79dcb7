package k8stest

import (
	"fmt"
	"strconv"
	"sync"

	apiextclientset "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apiextfake "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset/fake"
	k8serrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	k8sfake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"

	"github.com/cellium/cellium/api/client/clientset/versioned"
	ciliumfake "github.com/cellium/cellium/api/client/clientset/versioned/fake"
	"github.com/cellium/cellium/cells/k8s"
)

// Clientset is a k8s.Clientset over client-go's generated fakes. Its
// cilium.io part behaves like an API server where controllers care: it
// assigns UIDs, resourceVersions and creation timestamps, rejects an update
// with a stale resourceVersion and a delete whose preconditions do not
// match, both with a Conflict error.
type Clientset struct {
	*k8sfake.Clientset
	// CiliumFake is the cilium.io fake behind Cilium(), for its Actions and
	// for reactors that inject faults. Reactors prepended to it run before
	// the version checks.
	CiliumFake *ciliumfake.Clientset
}

var _ k8s.Clientset = (*Clientset)(nil)

// NewClientset returns an empty fake clientset.
func NewClientset() *Clientset {
	cs := &Clientset{Clientset: k8sfake.NewClientset(), CiliumFake: ciliumfake.NewSimpleClientset()}
	enforceVersions(cs.CiliumFake)
	return cs
}

// Cilium returns the cilium.io fake.
func (c *Clientset) Cilium() versioned.Interface { return c.CiliumFake }

// APIExtensions returns a new, empty apiextensions fake on each call.
func (c *Clientset) APIExtensions() apiextclientset.Interface {
	return apiextfake.NewSimpleClientset()
}

// RESTConfig returns an empty config: there is no server to reach.
func (c *Clientset) RESTConfig() *rest.Config { return &rest.Config{} }

// IsEnabled is always true.
func (c *Clientset) IsEnabled() bool { return true }

// enforceVersions makes the fake's writes check and bump resourceVersions
// and honour delete preconditions.
func enforceVersions(cs *ciliumfake.Clientset) {
	var (
		mu  sync.Mutex
		rev = 100
	)
	tracker := cs.Tracker()
	next := func() string { rev++; return strconv.Itoa(rev) }
	current := func(a k8stesting.Action, name string) (metav1.Object, error) {
		obj, err := tracker.Get(a.GetResource(), a.GetNamespace(), name)
		if err != nil {
			return nil, err
		}
		return meta.Accessor(obj)
	}
	cs.PrependReactor("create", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		obj := a.(k8stesting.CreateAction).GetObject().DeepCopyObject()
		m, _ := meta.Accessor(obj)
		m.SetResourceVersion(next())
		if m.GetUID() == "" {
			m.SetUID(types.UID(fmt.Sprintf("uid-%s-%d", m.GetName(), rev)))
		}
		if ts := m.GetCreationTimestamp(); ts.IsZero() {
			m.SetCreationTimestamp(metav1.Now())
		}
		return true, obj, tracker.Create(a.GetResource(), obj, a.GetNamespace())
	})
	cs.PrependReactor("update", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		obj := a.(k8stesting.UpdateAction).GetObject().DeepCopyObject()
		m, _ := meta.Accessor(obj)
		cur, err := current(a, m.GetName())
		if err != nil {
			return true, nil, err
		}
		if rv := m.GetResourceVersion(); rv != "" && rv != cur.GetResourceVersion() {
			return true, nil, k8serrors.NewConflict(a.GetResource().GroupResource(), m.GetName(),
				fmt.Errorf("resourceVersion %s is stale, current %s", rv, cur.GetResourceVersion()))
		}
		m.SetUID(cur.GetUID())
		m.SetCreationTimestamp(cur.GetCreationTimestamp())
		m.SetResourceVersion(next())
		return true, obj, tracker.Update(a.GetResource(), obj, a.GetNamespace())
	})
	cs.PrependReactor("delete", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		d := a.(k8stesting.DeleteActionImpl)
		cur, err := current(a, d.Name)
		if err != nil {
			return true, nil, err
		}
		if p := d.DeleteOptions.Preconditions; p != nil {
			if p.UID != nil && *p.UID != cur.GetUID() {
				return true, nil, k8serrors.NewConflict(a.GetResource().GroupResource(), d.Name,
					fmt.Errorf("precondition failed: UID in precondition: %v, UID in object meta: %s", *p.UID, cur.GetUID()))
			}
			if p.ResourceVersion != nil && *p.ResourceVersion != cur.GetResourceVersion() {
				return true, nil, k8serrors.NewConflict(a.GetResource().GroupResource(), d.Name,
					fmt.Errorf("precondition failed: ResourceVersion in precondition: %v, ResourceVersion in object meta: %s",
						*p.ResourceVersion, cur.GetResourceVersion()))
			}
		}
		return true, nil, tracker.Delete(a.GetResource(), a.GetNamespace(), d.Name)
	})
}
