package k8stest_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/cilium/statedb"
	"go.uber.org/goleak"
	k8serrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/k8s/k8stest"
	k8stables "github.com/cellium/cellium/statedb/k8s"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("k8s.io/klog/v2.(*loggingT).flushDaemon"))
}

// TestClientsetVersions checks that the fake refuses what the API server
// refuses: a stale update, and a delete whose UID or resourceVersion
// precondition does not match.
func TestClientsetVersions(t *testing.T) {
	ctx := context.Background()
	api := k8stest.NewClientset().Cilium().CiliumV2().CiliumNodes()
	created, err := api.Create(ctx, &ciliumv2.CiliumNode{ObjectMeta: metav1.ObjectMeta{Name: "a"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if created.UID == "" || created.ResourceVersion == "" || created.CreationTimestamp.IsZero() {
		t.Fatalf("created %+v, want UID, resourceVersion and creation timestamp set", created.ObjectMeta)
	}

	updated, err := api.Update(ctx, created.DeepCopy(), metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if updated.ResourceVersion == created.ResourceVersion || updated.UID != created.UID {
		t.Errorf("update: resourceVersion %s -> %s, UID %s -> %s; want a new version, the same UID",
			created.ResourceVersion, updated.ResourceVersion, created.UID, updated.UID)
	}
	if _, err := api.Update(ctx, created.DeepCopy(), metav1.UpdateOptions{}); !k8serrors.IsConflict(err) {
		t.Errorf("update with stale resourceVersion: err = %v, want a conflict", err)
	}

	otherUID, staleRV := types.UID("other"), created.ResourceVersion
	for _, p := range []metav1.Preconditions{{UID: &otherUID}, {UID: &updated.UID, ResourceVersion: &staleRV}} {
		if err := api.Delete(ctx, "a", metav1.DeleteOptions{Preconditions: &p}); !k8serrors.IsConflict(err) {
			t.Errorf("delete with precondition %+v: err = %v, want a conflict", p, err)
		}
	}
	p := metav1.Preconditions{UID: &updated.UID, ResourceVersion: &updated.ResourceVersion}
	if err := api.Delete(ctx, "a", metav1.DeleteOptions{Preconditions: &p}); err != nil {
		t.Errorf("delete with matching preconditions: %v", err)
	}
	if err := api.Delete(ctx, "a", metav1.DeleteOptions{}); !k8serrors.IsNotFound(err) {
		t.Errorf("delete of a deleted object: err = %v, want not found", err)
	}
}

// TestMirror checks that Mirror lists, marks the table initialized only
// when told, and follows the watch.
func TestMirror(t *testing.T) {
	ctx := context.Background()
	api := k8stest.NewClientset().Cilium().CiliumV2().CiliumNodes()
	if _, err := api.Create(ctx, &ciliumv2.CiliumNode{ObjectMeta: metav1.ObjectMeta{Name: "a"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	db := statedb.New()
	table, err := k8stables.NewCiliumNodesTable(db)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Stop() })
	initialized := make(chan struct{})
	k8stest.Mirror(t, db, table, api, initialized)

	names := func() string {
		var out []string
		for cn := range table.All(db.ReadTxn()) {
			out = append(out, cn.Name)
		}
		return fmt.Sprint(out)
	}
	if got := names(); got != "[a]" {
		t.Errorf("after the list: %s, want [a]", got)
	}
	if init, _ := table.Initialized(db.ReadTxn()); init {
		t.Error("table initialized before initialized was closed")
	}
	close(initialized)
	k8stest.Eventually(t, "the table initialized", func() error {
		if init, _ := table.Initialized(db.ReadTxn()); !init {
			return errors.New("not initialized")
		}
		return nil
	})

	if _, err := api.Create(ctx, &ciliumv2.CiliumNode{ObjectMeta: metav1.ObjectMeta{Name: "b"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := api.Delete(ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	k8stest.Eventually(t, "the watch followed", func() error {
		if got := names(); got != "[b]" {
			return fmt.Errorf("table %s, want [b]", got)
		}
		return nil
	})
}

func TestHealthRecorder(t *testing.T) {
	var h k8stest.HealthRecorder
	if l, _, _ := h.Last(); l != "" {
		t.Errorf("level %q before any report, want none", l)
	}
	h.Scope("sub").Degraded("failing", errors.New("boom"))
	if l, msg, err := h.Last(); l != hive.LevelDegraded || msg != "failing" || err == nil {
		t.Errorf("Last() = %s %q %v, want the degraded report", l, msg, err)
	}
	h.OK("fine")
	if l, msg, err := h.Last(); l != hive.LevelOK || msg != "fine" || err != nil {
		t.Errorf("Last() = %s %q %v, want ok", l, msg, err)
	}
}

func TestEventually(t *testing.T) {
	start, n := time.Now(), 0
	k8stest.Eventually(t, "three tries", func() error {
		if n++; n < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	if n != 3 || time.Since(start) > time.Second {
		t.Errorf("%d calls in %s, want 3 quickly", n, time.Since(start))
	}
}
