package lbipam_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	apiextclientset "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/client/clientset/versioned"
	"github.com/cellium/cellium/api/crds"
	"github.com/cellium/cellium/cells/crdregister"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/cells/k8s/k8stest"
	"github.com/cellium/cellium/cells/lbipam"
	"github.com/cellium/cellium/cells/leaderelection"
	"github.com/cellium/cellium/statedb/lb"
	"github.com/cellium/cellium/test/harness"
)

// cluster is the real etcd and kube-apiserver of the integration tests.
var cluster = harness.NewShared(harness.Options{})

// env is one integration test's clients and operator.
type env struct {
	t      *testing.T
	ctx    context.Context
	c      *harness.Cluster
	ns     string
	core   kubernetes.Interface
	cilium versioned.Interface
	opKube string
	op     *hive.Hive
	opCS   k8s.Clientset
	// all are the clientsets of every operator started, whose idle
	// connections stop() closes.
	all    []k8s.Clientset
	ignore goleak.Option
}

func newEnv(t *testing.T) *env {
	if testing.Short() {
		t.Skip("starts etcd and kube-apiserver")
	}
	c := cluster.Get(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	t.Cleanup(cancel)
	apiext, err := apiextclientset.NewForConfig(c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	all, err := crds.All()
	if err != nil {
		t.Fatal(err)
	}
	if err := crdregister.Register(ctx, apiext.ApiextensionsV1().CustomResourceDefinitions(), all, hivetest.Logger(t)); err != nil {
		t.Fatal(err)
	}
	// The operator runs with the chart's credentials.
	opKube, err := c.OperatorKubeconfig(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cfg := c.RESTConfig()
	cfg.QPS, cfg.Burst = 500, 500
	cilium, err := versioned.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	core, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, ctx: ctx, c: c, ns: c.TestNamespace(t), core: core, cilium: cilium, opKube: opKube}
	e.ignore = goleak.IgnoreCurrent()
	t.Cleanup(func() {
		ctx := context.Background()
		_ = cilium.CiliumV2().CiliumLoadBalancerIPPools().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
		_ = cilium.CiliumV2().CiliumNodes().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
	})
	return e
}

// start runs the operator's LB IPAM (leading at once).
func (e *env) start() {
	e.t.Helper()
	e.op = hivetest.New(e.t, []string{"--k8s-kubeconfig-path=" + e.opKube, "--leader-election=false"},
		k8s.ClientCell, k8s.OperatorResourcesCell, leaderelection.Cell, lbipam.Cell,
		hive.Provide(func() k8s.UserAgent { return "cellium-operator-lbipam-test" }), hivetest.Capture(&e.opCS))
	if err := e.op.Start(e.ctx); err != nil {
		e.t.Fatal(err)
	}
	e.all = append(e.all, e.opCS)
}

// stopOnly stops the operator.
func (e *env) stopOnly() {
	e.t.Helper()
	if err := e.op.Stop(context.Background()); err != nil {
		e.t.Fatal(err)
	}
}

// stop stops the operator and checks it left no goroutine behind.
func (e *env) stop() {
	e.t.Helper()
	e.stopOnly()
	var err error
	for range 5 {
		for _, cs := range e.all {
			k8s.CloseIdleConnections(cs)
		}
		if err = goleak.Find(e.ignore, goleak.IgnoreAnyFunction("k8s.io/klog/v2.(*loggingT).flushDaemon")); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	e.t.Fatalf("goroutines left after stop: %v", err)
}

func (e *env) pool(name string, sel map[string]string, blocks ...string) {
	e.t.Helper()
	p := &ciliumv2.CiliumLoadBalancerIPPool{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if sel != nil {
		p.Spec.ServiceSelector = &metav1.LabelSelector{MatchLabels: sel}
	}
	for _, b := range blocks {
		p.Spec.Blocks = append(p.Spec.Blocks, ciliumv2.CiliumLoadBalancerIPPoolIPBlock{Cidr: ciliumv2.IPv4orIPv6CIDR(b)})
	}
	if _, err := e.cilium.CiliumV2().CiliumLoadBalancerIPPools().Create(e.ctx, p, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func lbService(ns, name string, lbls, annotations map[string]string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: lbls, Annotations: annotations},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeLoadBalancer,
			Selector: map[string]string{"app": name},
			Ports:    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}},
		},
	}
}

func (e *env) service(name string, lbls, annotations map[string]string) {
	e.t.Helper()
	if _, err := e.core.CoreV1().Services(e.ns).Create(e.ctx, lbService(e.ns, name, lbls, annotations), metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func ingressIPs(svc *corev1.Service) []string {
	var out []string
	for _, i := range svc.Status.LoadBalancer.Ingress {
		out = append(out, i.IP)
	}
	return out
}

// waitService waits until the Service has exactly the addresses want and
// its condition has the reason.
func (e *env) waitService(name string, want []string, reason string) *corev1.Service {
	e.t.Helper()
	var svc *corev1.Service
	k8stest.Eventually(e.t, fmt.Sprintf("Service %s with %v (%s)", name, want, reason), func() error {
		var err error
		if svc, err = e.core.CoreV1().Services(e.ns).Get(e.ctx, name, metav1.GetOptions{}); err != nil {
			return err
		}
		if got := ingressIPs(svc); !slices.Equal(got, want) {
			return fmt.Errorf("ingress %v", got)
		}
		cond := meta.FindStatusCondition(svc.Status.Conditions, ciliumv2.ServiceRequestSatisfiedCondition)
		switch {
		case reason == "" && cond != nil:
			return fmt.Errorf("condition %+v, want none", cond)
		case reason == "":
		case cond == nil:
			return errors.New("no condition")
		case cond.Reason != reason:
			return fmt.Errorf("condition %s %s: %s", cond.Status, cond.Reason, cond.Message)
		case (reason == "satisfied") != (cond.Status == metav1.ConditionTrue):
			return fmt.Errorf("condition status %s", cond.Status)
		}
		return nil
	})
	return svc
}

// waitPool waits until the pool's counts are total/used/available and
// its condition of type condType (if any) has status.
func (e *env) waitPool(name string, total, used, available int, condType string, status metav1.ConditionStatus) *ciliumv2.CiliumLoadBalancerIPPool {
	e.t.Helper()
	var p *ciliumv2.CiliumLoadBalancerIPPool
	k8stest.Eventually(e.t, fmt.Sprintf("pool %s counts %d/%d/%d", name, total, used, available), func() error {
		var err error
		if p, err = e.cilium.CiliumV2().CiliumLoadBalancerIPPools().Get(e.ctx, name, metav1.GetOptions{}); err != nil {
			return err
		}
		msg := func(t string) string {
			if c := meta.FindStatusCondition(p.Status.Conditions, t); c != nil {
				return c.Message
			}
			return "<none>"
		}
		got := fmt.Sprintf("%s/%s/%s", msg(ciliumv2.PoolIPsTotalCondition), msg(ciliumv2.PoolIPsUsedCondition), msg(ciliumv2.PoolIPsAvailableCondition))
		if want := fmt.Sprintf("%d/%d/%d", total, used, available); got != want {
			return fmt.Errorf("counts %s", got)
		}
		if condType != "" {
			c := meta.FindStatusCondition(p.Status.Conditions, condType)
			if c == nil || c.Status != status {
				return fmt.Errorf("%s = %+v, want %s", condType, c, status)
			}
		}
		return nil
	})
	return p
}

// TestIntegrationLBIPAM runs LB IPAM with the operator's credentials
// against a real API server: allocation, pool counts, requested
// addresses, exhaustion, release on deletion and type change, pool
// conflicts, a pool overlapping a pod CIDR, pool deletion, and a restart
// that keeps every assignment.
func TestIntegrationLBIPAM(t *testing.T) {
	e := newEnv(t)
	// A node whose pod CIDR a pool will overlap.
	if _, err := e.cilium.CiliumV2().CiliumNodes().Create(e.ctx, &ciliumv2.CiliumNode{ObjectMeta: metav1.ObjectMeta{Name: "lbipam-node"},
		Spec: ciliumv2.NodeSpec{IPAM: ciliumv2.IPAMSpec{PodCIDRs: []string{"10.250.1.0/24"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.start()
	stopped := false
	defer func() {
		if !stopped {
			_ = e.op.Stop(context.Background())
		}
	}()
	small := map[string]string{"lb": "small"}

	// A Service gets the pool's first address; the pool counts it.
	e.pool("small", small, "192.0.2.0/30")
	t0 := time.Now()
	e.service("web-1", small, nil)
	svc := e.waitService("web-1", []string{"192.0.2.0"}, "satisfied")
	t.Logf("first address assigned %s after the Service's creation", time.Since(t0).Round(time.Millisecond))
	// The agents serve it: their derivation (kube-proxy replacement)
	// makes a LoadBalancer frontend of it.
	want := lb.L4Addr{Addr: netip.MustParseAddr("192.0.2.0"), Port: 80, Proto: 6}
	if !slices.ContainsFunc(lb.DeriveFrontends(svc, nil, lb.Options{KubeProxyReplacement: true}), func(f *lb.Frontend) bool {
		return f.Type == lb.TypeLoadBalancer && f.Address == want
	}) {
		t.Errorf("no LoadBalancer frontend %v derived from the Service", want)
	}
	e.waitPool("small", 4, 1, 3, ciliumv2.PoolConflictCondition, metav1.ConditionFalse)

	// A requested address (annotation), and one outside every pool.
	e.service("req", small, map[string]string{ciliumv2.LBIPAMIPsAnnotation: "192.0.2.3"})
	e.waitService("req", []string{"192.0.2.3"}, "satisfied")
	e.service("req-outside", small, map[string]string{ciliumv2.LBIPAMIPsAnnotation: "203.0.113.9"})
	e.waitService("req-outside", nil, "no_pool")

	// Exhaustion: two more fill the pool, the third waits with a reason.
	e.service("web-2", small, nil)
	e.service("web-3", small, nil)
	e.waitService("web-2", []string{"192.0.2.1"}, "satisfied")
	e.waitService("web-3", []string{"192.0.2.2"}, "satisfied")
	e.service("web-4", small, nil)
	svc = e.waitService("web-4", nil, "out_of_ips")
	if c := meta.FindStatusCondition(svc.Status.Conditions, ciliumv2.ServiceRequestSatisfiedCondition); !strings.Contains(c.Message, "ran out of allocatable IPs") {
		t.Errorf("out_of_ips message %q", c.Message)
	}
	e.waitPool("small", 4, 4, 0, "", "")

	// Deleting a Service releases its address to the waiting one.
	if err := e.core.CoreV1().Services(e.ns).Delete(e.ctx, "web-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitService("web-4", []string{"192.0.2.0"}, "satisfied")

	// A type change to ClusterIP takes the address and the condition back.
	cur, err := e.core.CoreV1().Services(e.ns).Get(e.ctx, "web-2", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Spec.Type = corev1.ServiceTypeClusterIP
	for i := range cur.Spec.Ports {
		cur.Spec.Ports[i].NodePort = 0
	}
	if _, err := e.core.CoreV1().Services(e.ns).Update(e.ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitService("web-2", nil, "")
	e.waitPool("small", 4, 3, 1, "", "")

	// A newer pool overlapping "small" is the conflicting one. (Creation
	// times have seconds only: a pool of the same second is newer when its
	// name sorts after; this one's does.)
	e.pool("small-newer", small, "192.0.2.2/31", "198.18.0.0/30")
	// 192.0.2.2 (web-3) and 192.0.2.3 (req) are in both pools.
	p := e.waitPool("small-newer", 6, 2, 4, ciliumv2.PoolConflictCondition, metav1.ConditionTrue)
	if c := meta.FindStatusCondition(p.Status.Conditions, ciliumv2.PoolConflictCondition); c.Reason != "cidr_overlap" || !strings.Contains(c.Message, "'small'") {
		t.Errorf("PoolConflict %+v", c)
	}
	e.waitPool("small", 4, 3, 1, ciliumv2.PoolConflictCondition, metav1.ConditionFalse)

	// A pool overlapping the node's pod CIDR: a condition and an Event,
	// and its Services get addresses outside the pod CIDR only.
	podSel := map[string]string{"lb": "pod"}
	e.pool("podoverlap", podSel, "10.250.1.0/24", "10.250.2.0/31")
	p = e.waitPool("podoverlap", 258, 256, 2, ciliumv2.PoolPodCIDRConflictCondition, metav1.ConditionTrue)
	if c := meta.FindStatusCondition(p.Status.Conditions, ciliumv2.PoolPodCIDRConflictCondition); !strings.Contains(c.Message, "10.250.1.0/24 of node lbipam-node") {
		t.Errorf("PodCIDRConflict %+v", c)
	}
	k8stest.Eventually(t, "a Warning Event about the overlap", func() error {
		evs, err := e.core.CoreV1().Events(metav1.NamespaceDefault).List(e.ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, ev := range evs.Items {
			if ev.InvolvedObject.Name == "podoverlap" && ev.Reason == "PodCIDROverlap" && ev.Type == corev1.EventTypeWarning {
				return nil
			}
		}
		return fmt.Errorf("none among %d Events", len(evs.Items))
	})
	e.service("pod-1", podSel, nil)
	e.service("pod-2", podSel, nil)
	e.service("pod-3", podSel, map[string]string{ciliumv2.LBIPAMIPsAnnotation: "10.250.1.7"})
	e.waitService("pod-1", []string{"10.250.2.0"}, "satisfied")
	e.waitService("pod-2", []string{"10.250.2.1"}, "satisfied")
	svc = e.waitService("pod-3", nil, "no_pool")
	if c := meta.FindStatusCondition(svc.Status.Conditions, ciliumv2.ServiceRequestSatisfiedCondition); !strings.Contains(c.Message, "pod CIDR") {
		t.Errorf("pod-3's condition %q does not name the pod CIDR", c.Message)
	}
	// Nothing else broke: "small" still serves.
	e.waitService("web-4", []string{"192.0.2.0"}, "satisfied")

	// Two Services with one sharing key and different ports share an
	// address; a third with a clashing port gets its own.
	shareSel := map[string]string{"lb": "share"}
	e.pool("share", shareSel, "198.19.0.0/30")
	key := map[string]string{ciliumv2.LBIPAMSharingKeyAnnotation: "front"}
	for name, port := range map[string]int32{"share-http": 80, "share-https": 443} {
		s := lbService(e.ns, name, shareSel, key)
		s.Spec.Ports[0].Port = port
		if _, err := e.core.CoreV1().Services(e.ns).Create(e.ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	e.waitService("share-http", []string{"198.19.0.0"}, "satisfied")
	e.waitService("share-https", []string{"198.19.0.0"}, "satisfied")
	e.service("share-clash", shareSel, key)
	e.waitService("share-clash", []string{"198.19.0.1"}, "satisfied")
	e.waitPool("share", 4, 2, 2, "", "")

	// Deleting a pool takes its addresses back.
	if err := e.cilium.CiliumV2().CiliumLoadBalancerIPPools().Delete(e.ctx, "podoverlap", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitService("pod-1", nil, "no_pool")
	e.waitService("pod-2", nil, "no_pool")
	k8stest.Eventually(t, "pod-3's condition no longer names the pod CIDR", func() error {
		svc, err := e.core.CoreV1().Services(e.ns).Get(e.ctx, "pod-3", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if c := meta.FindStatusCondition(svc.Status.Conditions, ciliumv2.ServiceRequestSatisfiedCondition); c == nil || strings.Contains(c.Message, "pod CIDR") {
			return fmt.Errorf("condition %+v", c)
		}
		return nil
	})

	// Settled, the operator writes nothing more: no status churn.
	rvs := e.versions()
	time.Sleep(1500 * time.Millisecond)
	if after := e.versions(); !maps.Equal(rvs, after) {
		t.Errorf("objects rewritten while nothing changed:\nbefore %v\nafter  %v", rvs, after)
	}

	// Restart: a new operator keeps every assignment although the lowest
	// address of "small" (192.0.2.1, web-2's until its type change) is
	// free, and hands that one to the next Service.
	before := map[string][]string{}
	list, err := e.core.CoreV1().Services(e.ns).List(e.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range list.Items {
		before[s.Name] = ingressIPs(&s)
	}
	e.stop()
	// While no operator runs, a Service is created.
	e.service("web-5", small, nil)
	e.start()
	e.waitService("web-5", []string{"192.0.2.1"}, "satisfied")
	for name, ips := range before {
		reason := "satisfied"
		switch name {
		case "web-2":
			reason = ""
		case "req-outside", "pod-1", "pod-2", "pod-3":
			reason = "no_pool"
		}
		e.waitService(name, ips, reason)
	}
	e.waitPool("small", 4, 4, 0, "", "")
	stopped = true
	e.stop()
}

// versions returns the resourceVersions of the test's Services and of
// the pools.
func (e *env) versions() map[string]string {
	e.t.Helper()
	out := map[string]string{}
	svcs, err := e.core.CoreV1().Services(e.ns).List(e.ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	for _, s := range svcs.Items {
		out["svc/"+s.Name] = s.ResourceVersion
	}
	pools, err := e.cilium.CiliumV2().CiliumLoadBalancerIPPools().List(e.ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	for _, p := range pools.Items {
		out["pool/"+p.Name] = p.ResourceVersion
	}
	return out
}

// TestIntegrationConcurrentServicesUniqueIPs creates many Services at
// once, in parallel, while the operator is restarted in the middle, and
// checks the invariant: every Service gets an address of the pool and no
// address is ever in two Services' status (sampled throughout).
func TestIntegrationConcurrentServicesUniqueIPs(t *testing.T) {
	e := newEnv(t)
	sel := map[string]string{"lb": "big"}
	e.pool("big", sel, "198.51.100.0/26")
	e.start()
	const n = 60
	var (
		wg       sync.WaitGroup
		errMu    sync.Mutex
		firstErr error
	)
	done := make(chan struct{})
	var once sync.Once
	finish := func() { once.Do(func() { close(done) }) }
	defer finish()
	stopped := false
	defer func() {
		if !stopped {
			_ = e.op.Stop(context.Background())
		}
	}()
	dupC := make(chan string, 1)
	// The sampler: lists the Services every few milliseconds and checks
	// that no address is listed twice.
	go func() {
		for {
			select {
			case <-done:
				close(dupC)
				return
			case <-time.After(20 * time.Millisecond):
			}
			list, err := e.core.CoreV1().Services(e.ns).List(e.ctx, metav1.ListOptions{})
			if err != nil {
				continue
			}
			if d := duplicate(list.Items); d != "" {
				dupC <- d
				<-done
				close(dupC)
				return
			}
		}
	}()
	create := func(from, to int) {
		for i := from; i < to; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := e.core.CoreV1().Services(e.ns).Create(e.ctx, lbService(e.ns, fmt.Sprintf("svc-%02d", i), sel, nil), metav1.CreateOptions{}); err != nil {
					errMu.Lock()
					firstErr = cmpErr(firstErr, err)
					errMu.Unlock()
				}
			}()
		}
	}
	t0 := time.Now()
	create(0, n/2)
	wg.Wait()
	// Restart while the second half is being created.
	e.stopOnly()
	create(n/2, n)
	e.start()
	wg.Wait()
	if firstErr != nil {
		t.Fatal(firstErr)
	}
	pfx := netip.MustParsePrefix("198.51.100.0/26")
	k8stest.Eventually(t, fmt.Sprintf("all %d Services with an address", n), func() error {
		list, err := e.core.CoreV1().Services(e.ns).List(e.ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		if d := duplicate(list.Items); d != "" {
			t.Fatalf("an address is in two Services' status: %s", d)
		}
		with := 0
		for _, s := range list.Items {
			ips := ingressIPs(&s)
			if len(ips) == 1 && pfx.Contains(netip.MustParseAddr(ips[0])) {
				with++
			}
		}
		if with != n {
			return fmt.Errorf("%d of %d", with, n)
		}
		return nil
	})
	t.Logf("%d Services created in parallel (operator restarted halfway) all had unique addresses %s after the first creation",
		n, time.Since(t0).Round(time.Millisecond))
	e.waitPool("big", 64, n, 64-n, ciliumv2.PoolConflictCondition, metav1.ConditionFalse)
	finish()
	if d, ok := <-dupC; ok {
		t.Fatalf("an address was in two Services' status: %s", d)
	}
	stopped = true
	e.stop()
}

// duplicate returns a description of an address two Services list, or "".
func duplicate(svcs []corev1.Service) string {
	seen := map[string]string{}
	for _, s := range svcs {
		for _, ip := range ingressIPs(&s) {
			if other, ok := seen[ip]; ok {
				return fmt.Sprintf("%s in %s and %s", ip, other, s.Name)
			}
			seen[ip] = s.Name
		}
	}
	return ""
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}
