package crdregister_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextfake "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset/fake"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	k8stesting "k8s.io/client-go/testing"

	"github.com/cellium/cellium/api/crds"
	"github.com/cellium/cellium/cells/crdregister"
	"github.com/cellium/cellium/cells/hive/hivetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func establish(t *testing.T, cs *apiextfake.Clientset, name string) {
	t.Helper()
	crd, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	crd.Status.Conditions = []apiextv1.CustomResourceDefinitionCondition{
		{Type: apiextv1.NamesAccepted, Status: apiextv1.ConditionTrue},
		{Type: apiextv1.Established, Status: apiextv1.ConditionTrue},
	}
	if _, err := cs.ApiextensionsV1().CustomResourceDefinitions().UpdateStatus(t.Context(), crd, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func writes(cs *apiextfake.Clientset) []string {
	var out []string
	for _, a := range cs.Actions() {
		if a.GetVerb() != "get" && a.GetVerb() != "list" && a.GetVerb() != "watch" {
			out = append(out, a.GetVerb())
		}
	}
	return out
}

// Register creates every CRD, returns only once each is Established (and
// its names accepted), and is idempotent: a second run writes nothing. A
// CRD whose spec drifted is updated, keeping labels others added.
func TestRegisterWaitsForEstablishedAndIsIdempotent(t *testing.T) {
	want, err := crds.All()
	if err != nil {
		t.Fatal(err)
	}
	cs := apiextfake.NewClientset()
	// Each watch Register opens is announced once it is registered, so
	// that the test knows Register is waiting (on that CRD).
	watches := make(chan struct{}, 100)
	cs.PrependWatchReactor("customresourcedefinitions", func(a k8stesting.Action) (bool, watch.Interface, error) {
		w, err := cs.Tracker().Watch(a.GetResource(), a.GetNamespace())
		watches <- struct{}{}
		return true, w, err
	})
	client := cs.ApiextensionsV1().CustomResourceDefinitions()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	done := make(chan error, 1)
	go func() { done <- crdregister.Register(ctx, client, want, hivetest.Logger(t)) }()

	// Register creates all, then waits on each CRD in turn: it watches the
	// first; once that one is Established, the second; and so on. It
	// returns only after the last.
	for _, crd := range want {
		select {
		case <-watches:
		case err := <-done:
			t.Fatalf("Register returned %v before %s was Established", err, crd.Name)
		case <-ctx.Done():
			t.Fatalf("Register never waited on %s", crd.Name)
		}
		select {
		case err := <-done:
			t.Fatalf("Register returned %v before %s was Established", err, crd.Name)
		default:
		}
		establish(t, cs, crd.Name)
	}
	list, err := client.List(ctx, metav1.ListOptions{})
	if err != nil || len(list.Items) != len(want) {
		t.Fatalf("%d CRDs (%v), want %d", len(list.Items), err, len(want))
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// Idempotent: nothing to write the second time.
	cs.ClearActions()
	if err := crdregister.Register(ctx, client, want, hivetest.Logger(t)); err != nil {
		t.Fatal(err)
	}
	if w := writes(cs); len(w) != 0 {
		t.Fatalf("second Register wrote %v", w)
	}

	// Drift: someone changed a CRD's spec and added a label.
	name := want[0].Name
	cur, err := client.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Spec.Names.ShortNames = []string{"drifted"}
	cur.Labels = map[string]string{"owner": "someone-else"}
	if _, err := client.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	cs.ClearActions()
	if err := crdregister.Register(ctx, client, want, hivetest.Logger(t)); err != nil {
		t.Fatal(err)
	}
	if w := writes(cs); len(w) != 1 || w[0] != "update" {
		t.Fatalf("after drift Register wrote %v, want one update", w)
	}
	got, err := client.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Spec.Names.ShortNames) != len(want[0].Spec.Names.ShortNames) || got.Labels["owner"] != "someone-else" {
		t.Fatalf("after repair: short names %v, labels %v", got.Spec.Names.ShortNames, got.Labels)
	}
	for k, v := range want[0].Labels {
		if got.Labels[k] != v {
			t.Fatalf("label %s=%s missing: %v", k, v, got.Labels)
		}
	}
}

// A context that ends while a CRD is not Established fails Register with
// the CRD's name.
func TestRegisterTimesOutNamingTheCRD(t *testing.T) {
	want, err := crds.All()
	if err != nil {
		t.Fatal(err)
	}
	cs := apiextfake.NewClientset()
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	err = crdregister.Register(ctx, cs.ApiextensionsV1().CustomResourceDefinitions(), want, hivetest.Logger(t))
	if err == nil || !strings.Contains(err.Error(), want[0].Name+" not Established") {
		t.Fatalf("err = %v, want one naming %s", err, want[0].Name)
	}
}
