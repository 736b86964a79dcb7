package clusterpool_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/statedb"
	k8serrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/clusterpool"
	"github.com/cellium/cellium/cells/clusterpool/cidralloc"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/k8s/k8stest"
	k8stables "github.com/cellium/cellium/statedb/k8s"
)

// env is one controller against a fake API server whose CiliumNodes are
// mirrored into a table.
type env struct {
	t      *testing.T
	cs     *k8stest.Clientset
	health *k8stest.HealthRecorder
	init   chan struct{}
}

// newEnv creates the nodes in the fake API, then starts the mirror and
// the controller. The table is initialized only after markInitialized.
func newEnv(t *testing.T, cidrs []string, mask int, nodes ...*ciliumv2.CiliumNode) *env {
	t.Helper()
	e := &env{t: t, cs: k8stest.NewClientset(), health: &k8stest.HealthRecorder{}, init: make(chan struct{})}
	for _, n := range nodes {
		e.create(n)
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
	api := e.cs.Cilium().CiliumV2().CiliumNodes()
	k8stest.Mirror(t, db, table, api, e.init)

	c, err := clusterpool.NewController(cidralloc.Config{IPv4CIDRs: cidrs, IPv4MaskSize: mask}, api, db, table, hivetest.Logger(t), e.health)
	if err != nil {
		t.Fatal(err)
	}
	clusterpool.SetRetryBackoff(c, 20*time.Millisecond, 100*time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := c.Run(ctx); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
	return e
}

func (e *env) markInitialized() { close(e.init) }

func node(name string, podCIDRs ...string) *ciliumv2.CiliumNode {
	cn := &ciliumv2.CiliumNode{ObjectMeta: metav1.ObjectMeta{Name: name}}
	cn.Spec.IPAM.PodCIDRs = podCIDRs
	return cn
}

func (e *env) create(cn *ciliumv2.CiliumNode) {
	e.t.Helper()
	if _, err := e.cs.Cilium().CiliumV2().CiliumNodes().Create(context.Background(), cn, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) delete(name string) {
	e.t.Helper()
	if err := e.cs.Cilium().CiliumV2().CiliumNodes().Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) get(name string) *ciliumv2.CiliumNode {
	e.t.Helper()
	cn, err := e.cs.Cilium().CiliumV2().CiliumNodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return cn
}

// waitCIDRs waits until the node's podCIDRs equal want.
func (e *env) waitCIDRs(name string, want ...string) {
	e.t.Helper()
	k8stest.Eventually(e.t, name+" podCIDRs", func() error {
		if got := e.get(name).Spec.IPAM.PodCIDRs; !slices.Equal(got, want) {
			return fmt.Errorf("podCIDRs %q, want %q", got, want)
		}
		return nil
	})
}

// waitProblem waits until the node's operator-status error contains want
// ("" waits for it to be empty).
func (e *env) waitProblem(name, want string) {
	e.t.Helper()
	k8stest.Eventually(e.t, name+" operator-status", func() error {
		got := e.get(name).Status.IPAM.OperatorStatus.Error
		if want == "" && got != "" || !strings.Contains(got, want) {
			return fmt.Errorf("operator-status.error %q, want %q", got, want)
		}
		return nil
	})
}

func (e *env) updates() int {
	n := 0
	for _, a := range e.cs.CiliumFake.Actions() {
		if a.GetVerb() == "update" {
			n++
		}
	}
	return n
}

func TestRestoresBeforeAllocating(t *testing.T) {
	// node-a holds the first node CIDR of the pool; node-b, listed before
	// it would be restored if the controller did not restore first, must
	// not get it.
	e := newEnv(t, []string{"10.0.0.0/22"}, 24,
		node("node-a", "10.0.0.0/24", "fd00::/120"),
		node("node-b"),
		node("node-c", "fd00::100/120"))
	e.markInitialized()
	e.waitCIDRs("node-b", "10.0.1.0/24")
	// IPv6 entries are kept; the IPv4 CIDR comes first.
	e.waitCIDRs("node-c", "10.0.2.0/24", "fd00::100/120")
	// node-a is untouched.
	if got := e.get("node-a").Spec.IPAM.PodCIDRs; !slices.Equal(got, []string{"10.0.0.0/24", "fd00::/120"}) {
		t.Errorf("node-a podCIDRs = %q, want unchanged", got)
	}
	k8stest.Eventually(t, "healthy", func() error {
		if l, msg, _ := e.health.Last(); l != hive.LevelOK || msg != "3 of 4 node CIDRs allocated" {
			return fmt.Errorf("health %s %q", l, msg)
		}
		return nil
	})
}

func TestWaitsForInitializedTable(t *testing.T) {
	e := newEnv(t, []string{"10.0.0.0/22"}, 24, node("node-a"))
	// The controller says it waits for the table; nothing else lets it on.
	k8stest.Eventually(t, "the controller waiting for the table", func() error {
		if _, msg, _ := e.health.Last(); msg != "waiting for the CiliumNodes table" {
			return fmt.Errorf("health %q", msg)
		}
		return nil
	})
	if n := e.updates(); n != 0 {
		t.Fatalf("%d updates before the CiliumNodes table was initialized", n)
	}
	e.markInitialized()
	e.waitCIDRs("node-a", "10.0.0.0/24")
}

func TestNewNodesAndRelease(t *testing.T) {
	e := newEnv(t, []string{"10.0.0.0/23"}, 24)
	e.markInitialized()
	e.create(node("node-a"))
	e.waitCIDRs("node-a", "10.0.0.0/24")
	e.create(node("node-b"))
	e.waitCIDRs("node-b", "10.0.1.0/24")

	// The pool is full: node-c waits, with the reason on its status and
	// in the health.
	e.create(node("node-c"))
	e.waitProblem("node-c", "cluster pool exhausted")
	e.waitProblem("node-c", "--cluster-pool-ipv4-cidr")
	if got := e.get("node-c").Spec.IPAM.PodCIDRs; len(got) != 0 {
		t.Fatalf("node-c podCIDRs = %q, want none", got)
	}
	k8stest.Eventually(t, "degraded health", func() error {
		l, _, err := e.health.Last()
		if l != hive.LevelDegraded || !errors.Is(err, cidralloc.ErrPoolExhausted) {
			return fmt.Errorf("health %s %v", l, err)
		}
		return nil
	})

	// Deleting node-a frees its CIDR for node-c, and the error goes.
	e.delete("node-a")
	e.waitCIDRs("node-c", "10.0.0.0/24")
	e.waitProblem("node-c", "")
	k8stest.Eventually(t, "healthy", func() error {
		if l, _, err := e.health.Last(); l != hive.LevelOK {
			return fmt.Errorf("health %s %v", l, err)
		}
		return nil
	})
}

func TestUnusableCIDRs(t *testing.T) {
	e := newEnv(t, []string{"10.0.0.0/22"}, 24,
		node("node-a", "10.0.1.0/24"),
		node("node-b", "10.0.1.0/24"),    // claimed twice
		node("node-c", "192.168.0.0/24"), // outside the pool
		node("node-d", "not-a-cidr"),
	)
	e.markInitialized()
	e.waitProblem("node-b", "held by node \"node-a\"")
	e.waitProblem("node-c", "CIDR not in the cluster pool")
	e.waitProblem("node-d", "invalid CIDRs")
	// Nothing is rewritten: a node's existing CIDRs are its pods' addresses.
	for name, want := range map[string]string{"node-b": "10.0.1.0/24", "node-c": "192.168.0.0/24", "node-d": "not-a-cidr"} {
		if got := e.get(name).Spec.IPAM.PodCIDRs; !slices.Equal(got, []string{want}) {
			t.Errorf("%s podCIDRs = %q, want [%s]", name, got, want)
		}
	}
	if got := e.get("node-a").Status.IPAM.OperatorStatus.Error; got != "" {
		t.Errorf("node-a operator-status.error = %q, want empty", got)
	}
	// A new node does not get a CIDR a node already claims.
	e.create(node("node-e"))
	e.waitCIDRs("node-e", "10.0.0.0/24")
	e.create(node("node-f"))
	e.waitCIDRs("node-f", "10.0.2.0/24")

	// When node-a goes, node-b's claim becomes valid.
	e.delete("node-a")
	e.waitProblem("node-b", "")
}

func TestRetriesFailedWrites(t *testing.T) {
	e := newEnv(t, []string{"10.0.0.0/22"}, 24, node("node-a"))
	// The first update conflicts (someone else wrote in between), the next
	// two fail outright; the controller must get there anyway.
	var calls atomic.Int32
	e.cs.CiliumFake.PrependReactor("update", "ciliumnodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		switch calls.Add(1) {
		case 1:
			return true, nil, k8serrors.NewConflict(a.GetResource().GroupResource(), "node-a", errors.New("injected"))
		case 2, 3:
			return true, nil, k8serrors.NewServiceUnavailable("injected")
		}
		return false, nil, nil
	})
	e.markInitialized()
	e.waitCIDRs("node-a", "10.0.0.0/24")
	if n := calls.Load(); n < 4 {
		t.Errorf("%d update calls, want at least 4", n)
	}
	k8stest.Eventually(t, "healthy", func() error {
		if l, _, err := e.health.Last(); l != hive.LevelOK {
			return fmt.Errorf("health %s %v", l, err)
		}
		return nil
	})
}

func TestNewControllerRejectsBadConfig(t *testing.T) {
	_, err := clusterpool.NewController(cidralloc.Config{IPv4CIDRs: []string{"10.0.0.0/24"}, IPv4MaskSize: 16}, nil, nil, nil, hivetest.Discard(), &k8stest.HealthRecorder{})
	if err == nil || !strings.Contains(err.Error(), "--cluster-pool-ipv4-mask-size") {
		t.Fatalf("err = %v, want one naming --cluster-pool-ipv4-mask-size", err)
	}
}
