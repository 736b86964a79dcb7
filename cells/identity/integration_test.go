package identity

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cilium/statedb"
	apiextclientset "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/client/clientset/versioned"
	"github.com/cellium/cellium/api/crds"
	"github.com/cellium/cellium/cells/crdregister"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/statedb/identity"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/labels"
)

// realAgent is the identity allocator of one agent against the real API
// server: the k8s client and CiliumIdentity mirror, and this cell.
type realAgent struct {
	db      *statedb.DB
	cids    statedb.Table[*ciliumv2.CiliumIdentity]
	alloc   Allocator
	filter  LabelFilter
	cluster ClusterName
}

func startRealAgent(t *testing.T, kubeconfig string, node k8s.NodeName) *realAgent {
	t.Helper()
	var ra realAgent
	hivetest.Start(t, []string{"--k8s-kubeconfig-path=" + kubeconfig},
		k8s.ClientCell,
		// Two agents share this process, so the node name is injected, not
		// read from K8S_NODE_NAME.
		hive.Provide(func() k8s.NodeName { return node }),
		k8s.CiliumIdentitiesCell,
		Cell,
		hivetest.Capture(&ra.alloc), hivetest.Capture(&ra.filter), hivetest.Capture(&ra.cluster),
		hivetest.Capture(&ra.db), hivetest.Capture(&ra.cids),
	)
	return &ra
}

// podIdentityLabels derives a pod's identity labels the way the endpoint
// manager does: every label from Kubernetes, then the filter.
func (ra *realAgent) podIdentityLabels(podLabels map[string]string, ns string) labels.Labels {
	all := labels.FromK8sPod(podLabels, ns, map[string]string{"kubernetes.io/metadata.name": ns}, "default", string(ra.cluster))
	id, _ := ra.filter.Split(all)
	return id
}

// TestIntegrationTwoAgents: two agents allocate the same 20 label sets at
// once, each for two pods per set whose labels differ only by
// pod-template-hash (an excluded label). Exactly 20 CiliumIdentities
// exist afterwards and both agents hold the same numbers.
func TestIntegrationTwoAgents(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the real kube-apiserver of test/harness")
	}
	c := cluster.Get(t)
	ctx := ctxTimeout(t, 2*time.Minute)
	all, err := crds.All()
	if err != nil {
		t.Fatal(err)
	}
	apiext := apiextclientset.NewForConfigOrDie(c.RESTConfig())
	if err := crdregister.Register(ctx, apiext.ApiextensionsV1().CustomResourceDefinitions(), all, hivetest.Logger(t)); err != nil {
		t.Fatal(err)
	}
	ns := c.TestNamespace(t) // unique: separates this run's identities from others'

	agents := []*realAgent{
		startRealAgent(t, c.Kubeconfig(), "node-a"),
		startRealAgent(t, c.Kubeconfig(), "node-b"),
	}
	// The first list may wait for the just-registered CRD to be served;
	// measure the allocations alone.
	t0 := time.Now()
	for _, ag := range agents {
		for {
			ok, watch := ag.cids.Initialized(ag.db.ReadTxn())
			if ok {
				break
			}
			select {
			case <-watch:
			case <-ctx.Done():
				t.Fatal("CiliumIdentities never listed")
			}
		}
	}
	t.Logf("CiliumIdentity tables initialized after %s", time.Since(t0))

	const sets = 20
	hashes := [][]string{{"5d4f8b6c7", "7f9c6d5b4"}, {"6b8d9f7c5", "8c7b6d5f9"}} // per agent, two pods per set
	got := make([][]identity.NumericIdentity, len(agents))
	var (
		wg sync.WaitGroup
		mu sync.Mutex
	)
	t0 = time.Now()
	for ai, ag := range agents {
		got[ai] = make([]identity.NumericIdentity, sets)
		for s := range sets {
			for _, hash := range hashes[ai] {
				wg.Go(func() {
					lbls := ag.podIdentityLabels(map[string]string{
						"app": fmt.Sprintf("app-%d", s), "tier": "backend", "pod-template-hash": hash,
					}, ns)
					id, err := ag.alloc.Allocate(ctx, lbls)
					if err != nil {
						t.Errorf("agent %d set %d: %v", ai, s, err)
						return
					}
					mu.Lock()
					defer mu.Unlock()
					if prev := got[ai][s]; prev != 0 && prev != id.ID {
						t.Errorf("agent %d set %d: pods differing only by pod-template-hash got %d and %d", ai, s, prev, id.ID)
					}
					got[ai][s] = id.ID
				})
			}
		}
	}
	wg.Wait()
	t.Logf("%d concurrent allocations of %d label sets by 2 agents took %s", sets*4, sets, time.Since(t0))
	if t.Failed() {
		return
	}
	if !slices.Equal(got[0], got[1]) {
		t.Errorf("agents disagree:\n a: %v\n b: %v", got[0], got[1])
	}

	cs := versioned.NewForConfigOrDie(c.RESTConfig())
	list, err := cs.CiliumV2().CiliumIdentities().List(ctx, metav1.ListOptions{LabelSelector: labels.PodNamespaceLabel + "=" + ns})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != sets {
		var names []string
		for _, o := range list.Items {
			names = append(names, o.Name)
		}
		t.Fatalf("%d CiliumIdentities for namespace %s, want %d: %v", len(list.Items), ns, sets, names)
	}
	byName := map[string]bool{}
	for _, o := range list.Items {
		byName[o.Name] = true
		if _, ok := o.SecurityLabels["k8s:pod-template-hash"]; ok {
			t.Errorf("identity %s has the excluded pod-template-hash label: %v", o.Name, o.SecurityLabels)
		}
		for _, k := range []string{"k8s:app", "k8s:tier", "k8s:io.kubernetes.pod.namespace",
			"k8s:io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name", "k8s:io.cilium.k8s.policy.cluster",
			"k8s:io.cilium.k8s.policy.serviceaccount"} {
			if _, ok := o.SecurityLabels[k]; !ok {
				t.Errorf("identity %s lacks %s: %v", o.Name, k, o.SecurityLabels)
			}
		}
	}
	// kubectl get ciliumid -l app=app-3,io.kubernetes.pod.namespace=<ns>:
	// the real apiserver selects by the identity's security labels.
	sel, err := cs.CiliumV2().CiliumIdentities().List(ctx, metav1.ListOptions{
		LabelSelector: "app=app-3,tier=backend," + labels.PodNamespaceLabel + "=" + ns})
	if err != nil {
		t.Fatal(err)
	}
	if len(sel.Items) != 1 || sel.Items[0].Name != got[0][3].StringID() {
		t.Errorf("-l app=app-3 lists %d identities, want only %d", len(sel.Items), got[0][3])
	}
	for s, id := range got[0] {
		if !byName[id.StringID()] {
			t.Errorf("set %d: identity %d has no object", s, id)
		}
		eventually(t, fmt.Sprintf("agent b sees identity %d", id), func() error {
			if _, _, ok := agents[1].cids.Get(agents[1].db.ReadTxn(), k8stables.NameIndex[*ciliumv2.CiliumIdentity]().Query(id.StringID())); !ok {
				return fmt.Errorf("not in agent b's CiliumIdentity table")
			}
			return nil
		})
	}
}
