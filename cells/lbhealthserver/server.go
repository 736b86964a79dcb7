package lbhealthserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/cellium/cellium/cells/hive"
	k8stables "github.com/cellium/cellium/statedb/k8s"
)

// A port that could not be bound is tried again after RetryMin, the
// wait doubling up to RetryMax while some port stays unserved (the
// Services not changing meanwhile).
const (
	RetryMin = 500 * time.Millisecond
	RetryMax = 10 * time.Second
)

// Response is the body of every answer, kube-proxy's and Cilium's JSON.
type Response struct {
	Service        ServiceName `json:"service"`
	LocalEndpoints int         `json:"localEndpoints"`
}

// ServiceName names the Service of a Response.
type ServiceName struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

// HealthCheckNodePort returns the healthCheckNodePort svc needs served:
// set, externalTrafficPolicy Local, type LoadBalancer or NodePort.
func HealthCheckNodePort(svc *corev1.Service) (uint16, bool) {
	p := svc.Spec.HealthCheckNodePort
	if p <= 0 || p > 65535 || svc.Spec.ExternalTrafficPolicy != corev1.ServiceExternalTrafficPolicyLocal {
		return 0, false
	}
	if svc.Spec.Type != corev1.ServiceTypeLoadBalancer && svc.Spec.Type != corev1.ServiceTypeNodePort {
		return 0, false
	}
	return uint16(p), true
}

// Server keeps one HTTP listener per healthCheckNodePort the Services
// table asks for. Create it with New; Run it in one goroutine.
type Server struct {
	db       *statedb.DB
	services statedb.Table[*corev1.Service]
	slices   statedb.Table[*discoveryv1.EndpointSlice]
	node     string
	bind     netip.Addr
	log      *slog.Logger

	// listeners are the open ports, by port; reported is the last error
	// logged per port that could not be served. Only Run touches them.
	listeners map[uint16]*listener
	reported  map[uint16]string
}

type listener struct {
	service string // "namespace/name"
	srv     *http.Server
	done    chan struct{}
}

// New returns a server for the Services of services, counting the ready
// endpoints of slices on node; it listens on bind (invalid: every
// address). It starts nothing.
func New(db *statedb.DB, services statedb.Table[*corev1.Service], slices statedb.Table[*discoveryv1.EndpointSlice],
	node string, bind netip.Addr, log *slog.Logger) *Server {
	return &Server{db: db, services: services, slices: slices, node: node, bind: bind, log: log,
		listeners: map[uint16]*listener{}, reported: map[uint16]string{}}
}

// Run serves the ports the Services ask for until ctx ends, then closes
// them all. Ports that could not be bound make h degraded and are tried
// again (RetryMin, RetryMax).
func (s *Server) Run(ctx context.Context, h hive.Health) {
	defer s.closeAll()
	backoff := RetryMin
	for {
		all, watch := s.services.AllWatch(s.db.ReadTxn())
		want, errs := desired(all)
		errs = append(errs, s.sync(want)...)
		var retry <-chan time.Time
		if len(errs) > 0 {
			h.Degraded(fmt.Sprintf("%d health check node ports served, %d not", len(s.listeners), len(errs)), errors.Join(errs...))
			retry = time.After(backoff)
			backoff = min(2*backoff, RetryMax)
		} else {
			h.OK(fmt.Sprintf("%d health check node ports served", len(s.listeners)))
			backoff = RetryMin
		}
		select {
		case <-ctx.Done():
			return
		case <-watch:
		case <-retry:
		}
	}
}

// ErrPortConflict means two Services ask for the same healthCheckNodePort:
// the first by name gets it.
var ErrPortConflict = errors.New("healthCheckNodePort already served for another Service")

// desired returns the port each Service asks for, the first Service by
// name winning a port two ask for, and an error per loser.
func desired(all func(func(*corev1.Service, statedb.Revision) bool)) (map[uint16]string, []error) {
	byPort := map[uint16][]string{}
	for svc := range all {
		if port, ok := HealthCheckNodePort(svc); ok {
			byPort[port] = append(byPort[port], k8stables.Key(svc))
		}
	}
	want := map[uint16]string{}
	var errs []error
	for _, port := range slices.Sorted(maps.Keys(byPort)) {
		names := byPort[port]
		slices.Sort(names)
		want[port] = names[0]
		for _, n := range names[1:] {
			errs = append(errs, fmt.Errorf("service %s: port %d: %w (%s)", n, port, ErrPortConflict, names[0]))
		}
	}
	return want, errs
}

// sync closes the listeners no Service wants (or another Service wants
// now) and opens the missing ones; it returns an error per port that
// could not be bound, logging each once.
func (s *Server) sync(want map[uint16]string) []error {
	for port, l := range s.listeners {
		if want[port] != l.service {
			l.close()
			delete(s.listeners, port)
			s.log.Info("Closed health check node port", "port", port, "service", l.service)
		}
	}
	var errs []error
	for _, port := range slices.Sorted(maps.Keys(want)) {
		svc := want[port]
		if _, ok := s.listeners[port]; ok {
			continue
		}
		l, err := s.listen(port, svc)
		if err != nil {
			err = fmt.Errorf("service %s: listen on healthCheckNodePort %d: %w", svc, port, err)
			if s.reported[port] != err.Error() {
				s.log.Warn("Cannot serve health check node port; retrying", "port", port, "service", svc, "error", err)
				s.reported[port] = err.Error()
			}
			errs = append(errs, err)
			continue
		}
		delete(s.reported, port)
		s.listeners[port] = l
		s.log.Info("Serving health check node port", "port", port, "service", svc)
	}
	for port := range s.reported {
		if _, ok := want[port]; !ok {
			delete(s.reported, port)
		}
	}
	return errs
}

func (s *Server) listen(port uint16, svc string) (*listener, error) {
	addr := ":" + strconv.Itoa(int(port))
	if s.bind.IsValid() {
		addr = netip.AddrPortFrom(s.bind, port).String()
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	l := &listener{service: svc, done: make(chan struct{})}
	l.srv = &http.Server{Handler: s.handler(svc), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		defer close(l.done)
		_ = l.srv.Serve(ln)
	}()
	return l, nil
}

func (l *listener) close() {
	_ = l.srv.Close()
	<-l.done
}

func (s *Server) closeAll() {
	for port, l := range s.listeners {
		l.close()
		delete(s.listeners, port)
	}
}

// LocalEndpoints counts the ready endpoints of Service key
// ("namespace/name") on this node: the distinct addresses of its
// EndpointSlices' endpoints whose nodeName is the node and whose ready
// condition is true or unset.
func (s *Server) LocalEndpoints(txn statedb.ReadTxn, key string) int {
	seen := map[string]bool{}
	for sl := range s.slices.List(txn, k8stables.EndpointSliceServiceIndex.Query(key)) {
		for _, ep := range sl.Endpoints {
			if ep.NodeName == nil || *ep.NodeName != s.node || len(ep.Addresses) == 0 {
				continue
			}
			if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				continue
			}
			seen[ep.Addresses[0]] = true
		}
	}
	return len(seen)
}

// handler answers every request for Service key as kube-proxy does:
// the JSON Response, 200 with local endpoints, 503 without.
func (s *Server) handler(key string) http.Handler {
	ns, name, _ := strings.Cut(key, "/")
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		resp := Response{Service: ServiceName{Namespace: ns, Name: name}, LocalEndpoints: s.LocalEndpoints(s.db.ReadTxn(), key)}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("X-Load-Balancing-Endpoint-Weight", strconv.Itoa(resp.LocalEndpoints))
		if resp.LocalEndpoints == 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
		} else {
			w.WriteHeader(http.StatusOK)
		}
		_ = json.NewEncoder(w).Encode(resp)
	})
}
