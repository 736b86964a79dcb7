package lbhealthserver_test

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/cells/k8s/k8stest"
	"github.com/cellium/cellium/cells/lbhealthserver"
	k8stables "github.com/cellium/cellium/statedb/k8s"
	"github.com/cellium/cellium/statedb/lb"
)

// loopback is a loopback address of this test process (as Cilium's
// tests choose theirs), so that parallel runs do not share ports.
func loopback() netip.Addr {
	pid := os.Getpid()
	return netip.AddrFrom4([4]byte{127, 1 + byte(pid>>16), byte(pid >> 8), 1 | byte(pid)})
}

type env struct {
	db     *statedb.DB
	svcs   statedb.RWTable[*corev1.Service]
	slices statedb.RWTable[*discoveryv1.EndpointSlice]
	health hive.HealthReporter
	bind   netip.Addr
	client *http.Client
}

// start runs the cell with args on the node "node1", kube-proxy
// replacement as kpr says, listening on loopback().
func start(t *testing.T, kpr bool, args ...string) *env {
	e := &env{bind: loopback(), client: &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}}
	hivetest.Start(t, args,
		hive.Provide(
			func(db *statedb.DB) (statedb.RWTable[*corev1.Service], error) { return k8stables.NewServicesTable(db) },
			func(db *statedb.DB) (statedb.RWTable[*discoveryv1.EndpointSlice], error) {
				return k8stables.NewEndpointSlicesTable(db)
			},
			statedb.RWTable[*corev1.Service].ToTable, statedb.RWTable[*discoveryv1.EndpointSlice].ToTable,
			func() k8s.NodeName { return "node1" },
			func() lb.KubeProxyReplacement { return lb.KubeProxyReplacement{Enabled: kpr} },
			func() lbhealthserver.BindAddress { return lbhealthserver.BindAddress(e.bind) },
		),
		lbhealthserver.Cell,
		hivetest.Capture(&e.db), hivetest.Capture(&e.svcs), hivetest.Capture(&e.slices), hivetest.Capture(&e.health),
	)
	return e
}

func (e *env) upsert(t *testing.T, objs ...any) {
	t.Helper()
	wtxn := e.db.WriteTxn(e.svcs, e.slices)
	defer wtxn.Commit()
	for _, o := range objs {
		var err error
		switch o := o.(type) {
		case *corev1.Service:
			_, _, err = e.svcs.Insert(wtxn, o)
		case *discoveryv1.EndpointSlice:
			_, _, err = e.slices.Insert(wtxn, o)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

func (e *env) deleteService(t *testing.T, svc *corev1.Service) {
	t.Helper()
	wtxn := e.db.WriteTxn(e.svcs)
	defer wtxn.Commit()
	if _, _, err := e.svcs.Delete(wtxn, svc); err != nil {
		t.Fatal(err)
	}
}

// service is a LoadBalancer (or typ) Service ns/name with
// externalTrafficPolicy etp and healthCheckNodePort port.
func service(name string, typ corev1.ServiceType, etp corev1.ServiceExternalTrafficPolicy, port int32) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}, Spec: corev1.ServiceSpec{
		Type: typ, ExternalTrafficPolicy: etp, HealthCheckNodePort: port, ClusterIP: "10.96.0.10",
		Ports: []corev1.ServicePort{{Port: 80, NodePort: 30080}},
	}}
}

// slice is an EndpointSlice of Service ns/svc with one endpoint per
// "address@node[!]" ("!": not ready).
func slice(svc, name string, eps ...string) *discoveryv1.EndpointSlice {
	sl := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name,
		Labels: map[string]string{discoveryv1.LabelServiceName: svc}}, AddressType: discoveryv1.AddressTypeIPv4}
	for _, ep := range eps {
		addr, node, _ := strings.Cut(ep, "@")
		ready := !strings.HasSuffix(node, "!")
		node = strings.TrimSuffix(node, "!")
		sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{Addresses: []string{addr}, NodeName: &node,
			Conditions: discoveryv1.EndpointConditions{Ready: &ready}})
	}
	return sl
}

// get asks port; it returns the status and body, or an error (refused).
func (e *env) get(port uint16) (int, string, error) {
	resp, err := e.client.Get("http://" + netip.AddrPortFrom(e.bind, port).String() + "/")
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.Header.Get("Content-Type") != "application/json" {
		return 0, "", fmt.Errorf("content type %q", resp.Header.Get("Content-Type"))
	}
	return resp.StatusCode, string(b), err
}

// expect waits until port answers status with body.
func (e *env) expect(t *testing.T, port uint16, status int, body string) {
	t.Helper()
	k8stest.Eventually(t, fmt.Sprintf("port %d answers %d %s", port, status, body), func() error {
		code, got, err := e.get(port)
		if err != nil {
			return err
		}
		if code != status || got != body+"\n" {
			return fmt.Errorf("got %d %q", code, got)
		}
		return nil
	})
}

// expectClosed waits until nothing listens on port.
func (e *env) expectClosed(t *testing.T, port uint16) {
	t.Helper()
	k8stest.Eventually(t, fmt.Sprintf("port %d closed", port), func() error {
		_, _, err := e.get(port)
		if !errors.Is(err, syscall.ECONNREFUSED) {
			return fmt.Errorf("get: %v, want connection refused", err)
		}
		return nil
	})
}

// health returns the cell's job health.
func (e *env) moduleHealth() hive.HealthStatus {
	for _, s := range e.health.Modules() {
		if s.Module == "loadbalancer-healthserver" {
			return s
		}
	}
	return hive.HealthStatus{}
}

const (
	port1 = 32101
	port2 = 32102
)

// A LoadBalancer Service with externalTrafficPolicy Local gets its
// healthCheckNodePort served: 503 and 0 while the node has no ready
// endpoint (another node's and an unready one do not count), 200 and the
// count once it has, back to 503 when they go; a second (NodePort) Service
// gets its own port and count; a Service changed to
// externalTrafficPolicy Cluster or deleted has its port closed, the other
// port staying up.
func TestHealthCheckNodePort(t *testing.T) {
	e := start(t, true)
	a := service("a", corev1.ServiceTypeLoadBalancer, corev1.ServiceExternalTrafficPolicyLocal, port1)
	e.upsert(t, a, slice("a", "a-1", "10.0.2.1@node2", "10.0.1.9@node1!"))
	e.expect(t, port1, http.StatusServiceUnavailable, `{"service":{"namespace":"ns","name":"a"},"localEndpoints":0}`)

	e.upsert(t, slice("a", "a-1", "10.0.2.1@node2", "10.0.1.9@node1!", "10.0.1.1@node1"),
		slice("a", "a-2", "10.0.1.2@node1", "10.0.1.1@node1"))
	e.expect(t, port1, http.StatusOK, `{"service":{"namespace":"ns","name":"a"},"localEndpoints":2}`)
	resp, err := e.client.Get("http://" + netip.AddrPortFrom(e.bind, port1).String() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if w := resp.Header.Get("X-Load-Balancing-Endpoint-Weight"); w != "2" || resp.StatusCode != http.StatusOK {
		t.Errorf("any path: %d, weight %q; want 200, 2", resp.StatusCode, w)
	}

	b := service("b", corev1.ServiceTypeNodePort, corev1.ServiceExternalTrafficPolicyLocal, port2)
	e.upsert(t, b, slice("b", "b-1", "10.0.1.5@node1"))
	e.expect(t, port2, http.StatusOK, `{"service":{"namespace":"ns","name":"b"},"localEndpoints":1}`)

	e.upsert(t, slice("a", "a-1", "10.0.2.1@node2"), slice("a", "a-2"))
	e.expect(t, port1, http.StatusServiceUnavailable, `{"service":{"namespace":"ns","name":"a"},"localEndpoints":0}`)

	cluster := b.DeepCopy()
	cluster.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster
	e.upsert(t, cluster)
	e.expectClosed(t, port2)
	e.expect(t, port1, http.StatusServiceUnavailable, `{"service":{"namespace":"ns","name":"a"},"localEndpoints":0}`)

	e.deleteService(t, a)
	e.expectClosed(t, port1)
	if h := e.moduleHealth(); h.Level != hive.LevelOK {
		t.Errorf("health %+v, want ok", h)
	}
}

// A port taken by another process is reported (degraded health naming
// the Service and the port) while the other Service's port is served;
// once the port is free it is served at the next retry. Two
// Services asking for one port: the first by name gets it, the other is
// reported.
func TestHealthCheckNodePortCollision(t *testing.T) {
	e := start(t, true)
	taken, err := net.Listen("tcp", netip.AddrPortFrom(e.bind, port1).String())
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	e.upsert(t, service("a", corev1.ServiceTypeLoadBalancer, corev1.ServiceExternalTrafficPolicyLocal, port1),
		service("b", corev1.ServiceTypeLoadBalancer, corev1.ServiceExternalTrafficPolicyLocal, port2),
		slice("b", "b-1", "10.0.1.5@node1"))
	e.expect(t, port2, http.StatusOK, `{"service":{"namespace":"ns","name":"b"},"localEndpoints":1}`)
	k8stest.Eventually(t, "degraded health naming port 32101", func() error {
		h := e.moduleHealth()
		if h.Level != hive.LevelDegraded || !strings.Contains(h.Error, "service ns/a: listen on healthCheckNodePort 32101") ||
			!strings.Contains(h.Error, "address already in use") {
			return fmt.Errorf("health %+v", h)
		}
		return nil
	})
	taken.Close()
	e.expect(t, port1, http.StatusServiceUnavailable, `{"service":{"namespace":"ns","name":"a"},"localEndpoints":0}`)

	// c wants b's port: b keeps it, c is reported.
	e.upsert(t, service("c", corev1.ServiceTypeLoadBalancer, corev1.ServiceExternalTrafficPolicyLocal, port2))
	k8stest.Eventually(t, "conflict reported", func() error {
		h := e.moduleHealth()
		if h.Level != hive.LevelDegraded || !strings.Contains(h.Error, "service ns/c: port 32102: "+lbhealthserver.ErrPortConflict.Error()) {
			return fmt.Errorf("health %+v", h)
		}
		return nil
	})
	e.expect(t, port2, http.StatusOK, `{"service":{"namespace":"ns","name":"b"},"localEndpoints":1}`)
}

// Without kube-proxy replacement, or with
// --enable-health-check-nodeport=false, nothing listens.
func TestHealthCheckNodePortOff(t *testing.T) {
	for _, c := range []struct {
		kpr  bool
		args []string
	}{{false, nil}, {true, []string{"--enable-health-check-nodeport=false"}}} {
		e := start(t, c.kpr, c.args...)
		e.upsert(t, service("a", corev1.ServiceTypeLoadBalancer, corev1.ServiceExternalTrafficPolicyLocal, port1))
		// The cell started no job (no health report of it), so nothing
		// will ever listen.
		if h := e.moduleHealth(); h.Module != "" {
			t.Errorf("kpr %v %v: the cell runs: %+v", c.kpr, c.args, h)
		}
		if _, _, err := e.get(port1); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("kpr %v %v: get: %v, want refused", c.kpr, c.args, err)
		}
	}
}
