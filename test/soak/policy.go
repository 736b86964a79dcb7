package soak

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	api "github.com/cellium/cellium/api/policy"
	"github.com/cellium/cellium/datapath/loader"
	dpmaps "github.com/cellium/cellium/datapath/maps"
	"github.com/cellium/cellium/test/devkubelet"
)

// The soak's policy: pods labelled guardedLabel=guardedValue (app=db)
// take ingress only from pods labelled app=web. Relabels move pods in and
// out of both sides.
const (
	policyName   = "soak-db-from-web"
	guardedLabel = "app"
	guardedValue = "db"
	allowedValue = "web"
)

// The pinned pair: two pods the soak never deletes nor relabels, with a
// TCP connection from client to server held for the whole run. The
// server is guarded, the client allowed.
const (
	pinnedServer = "pin-srv"
	pinnedClient = "pin-cli"
)

var pinnedLabels = map[string]map[string]string{
	pinnedServer: {"app": "db", "soak": "pinned"},
	pinnedClient: {"app": "web", "soak": "pinned"},
}

// Probe timing: a probe expected to pass gets allowedTimeout (a SYN
// retransmission fits), one expected to be dropped deniedTimeout (a
// connection over a local veth takes well under a millisecond).
// A probe whose verdict is wrong is repeated until probeSettle after the
// quiescent point converged; only then is it a violation.
const (
	allowedTimeout = 2 * time.Second
	deniedTimeout  = 500 * time.Millisecond
	probeSettle    = 10 * time.Second
	// flowTimeout bounds one exchange on the pinned connection.
	flowTimeout = 5 * time.Second
)

// soakPolicy is the CiliumNetworkPolicy the soak creates at its start.
func soakPolicy(namespace string) *ciliumv2.CiliumNetworkPolicy {
	return &ciliumv2.CiliumNetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: policyName, Namespace: namespace},
		Spec: &api.Rule{
			EndpointSelector: &api.EndpointSelector{MatchLabels: map[string]string{guardedLabel: guardedValue}},
			Ingress: []api.IngressRule{{IngressCommonRule: api.IngressCommonRule{
				FromEndpoints: []api.EndpointSelector{{MatchLabels: map[string]string{guardedLabel: allowedValue}}},
			}}},
		},
	}
}

// allowedByPolicy says whether the soak's policy lets a pod with labels
// src open a TCP connection to a pod with labels dst.
func allowedByPolicy(src, dst map[string]string) bool {
	return dst[guardedLabel] != guardedValue || src[guardedLabel] == allowedValue
}

// probe is one policy probe: a TCP connection from src to dst.
type probe struct {
	src, dst       string
	srcNS          string
	dstIP          netip.Addr
	srcLbl, dstLbl map[string]string
	// want is the policy's verdict for the labels at the time of the
	// probe.
	want bool
	// tries counts the outcomes that were not want, last the last one.
	tries int
	last  bool
}

func (p probe) String() string {
	verdict := map[bool]string{true: "allowed", false: "denied"}[p.want]
	return fmt.Sprintf("%s %v -> %s %v (%s) tcp/%d, %s", p.src, p.srcLbl, p.dst, p.dstLbl, p.dstIP, probePort, verdict)
}

// probeViolation is the violation of a probe that never got its
// verdict.
func probeViolation(p probe) Violation {
	if p.want {
		return Violation{Invariant: "policy-blocked", Object: "probe " + p.src + "->" + p.dst,
			Message: fmt.Sprintf("%s: the connection failed %d time(s) over %s after convergence", p, p.tries, probeSettle)}
	}
	return Violation{Invariant: "policy-leak", Object: "probe " + p.src + "->" + p.dst,
		Message: fmt.Sprintf("%s: the connection went through %d time(s) over %s after convergence", p, p.tries, probeSettle)}
}

// pickProbes chooses the probes of one quiescent point among the live
// pods with ready sandboxes: the pinned client to the pinned server
// (allowed), a pod that is not app=web to a guarded pod (denied) and a
// few random pairs. Labels are the soak's: what it last set.
func (s *Soak) pickProbes(sbs map[string]devkubelet.Sandbox) []probe {
	names := slices.Sorted(maps.Keys(sbs))
	mk := func(src, dst string) (probe, bool) {
		ip, err := netip.ParseAddr(sbs[dst].IP)
		if src == dst || err != nil {
			return probe{}, false
		}
		sl, dl := s.alive[src].labels, s.alive[dst].labels
		return probe{src: src, dst: dst, srcNS: sbs[src].NetnsPath, dstIP: ip, srcLbl: sl, dstLbl: dl, want: allowedByPolicy(sl, dl)}, true
	}
	var out []probe
	seen := map[[2]string]bool{}
	add := func(src, dst string) {
		if p, ok := mk(src, dst); ok && !seen[[2]string{src, dst}] {
			seen[[2]string{src, dst}] = true
			out = append(out, p)
		}
	}
	add(pinnedClient, pinnedServer)
	var guarded, others []string
	for _, n := range names {
		if s.alive[n].labels[guardedLabel] == guardedValue {
			guarded = append(guarded, n)
		}
		if s.alive[n].labels[guardedLabel] != allowedValue {
			others = append(others, n)
		}
	}
	var denied [][2]string
	for _, src := range others {
		for _, dst := range guarded {
			if src != dst {
				denied = append(denied, [2]string{src, dst})
			}
		}
	}
	if len(denied) > 0 {
		d := denied[s.rng.IntN(len(denied))]
		add(d[0], d[1])
	}
	for range 3 {
		if len(names) > 1 {
			add(names[s.rng.IntN(len(names))], names[s.rng.IntN(len(names))])
		}
	}
	return out
}

// liveSandboxes are the ready sandboxes of the pods the soak keeps,
// pinned ones included, by pod name.
func (s *Soak) liveSandboxes() map[string]devkubelet.Sandbox {
	out := map[string]devkubelet.Sandbox{}
	for _, sb := range s.sandboxes() {
		if st, ok := s.alive[sb.Name]; ok && string(sb.UID) == st.uid && sb.State == devkubelet.SandboxReady && sb.IP != "" {
			out[sb.Name] = sb
		}
	}
	return out
}

// probePolicy runs the policy probes of a quiescent point: each probed
// pod gets an echo server for the time of the probes, each probe must
// get its verdict within probeSettle.
func (s *Soak) probePolicy(ctx context.Context) []Violation {
	sbs := s.liveSandboxes()
	probes := s.pickProbes(sbs)
	servers := map[string]*echoServer{}
	defer func() {
		for _, e := range servers {
			e.Close()
		}
	}()
	var out []Violation
	for _, p := range probes {
		if servers[p.dst] != nil {
			continue
		}
		e, err := listenIn(sbs[p.dst].NetnsPath, netip.AddrPortFrom(p.dstIP, probePort))
		if err != nil {
			out = append(out, Violation{Invariant: "probe-setup", Object: "pod " + p.dst, Message: err.Error()})
			continue
		}
		servers[p.dst] = e
	}
	if len(out) > 0 {
		return out
	}
	dropsBefore, dropErr := s.policyDrops()
	denied := 0
	deadline := time.Now().Add(probeSettle)
	pending := probes
	for len(pending) > 0 && ctx.Err() == nil {
		var again []probe
		for _, p := range pending {
			timeout := deniedTimeout
			if p.want {
				timeout = allowedTimeout
			}
			got, err := probeTCP(p.srcNS, netip.AddrPortFrom(p.dstIP, probePort), timeout)
			s.count("policy-probes", 1)
			if err != nil {
				return append(out, Violation{Invariant: "probe-setup", Object: "pod " + p.src, Message: err.Error()})
			}
			if got == p.want {
				if !p.want {
					s.count("policy-probes-denied", 1)
					denied++
				}
				continue
			}
			s.count("policy-probe-retries", 1)
			p.tries++
			p.last = got
			again = append(again, p)
		}
		if len(again) > 0 && time.Now().After(deadline) {
			for _, p := range again {
				out = append(out, probeViolation(p))
			}
			break
		}
		if len(again) > 0 {
			s.tl.Addf("probe", "%d probe(s) not at their verdict yet, e.g. %s: again", len(again), again[0])
			s.pace(ctx, 500*time.Millisecond)
		}
		pending = again
	}
	if len(out) > 0 {
		return out
	}
	// The dropped SYNs are counted as policy drops.
	dropsAfter, err := s.policyDrops()
	switch {
	case dropErr != nil || err != nil:
		out = append(out, Violation{Invariant: "probe-setup", Object: "metrics map", Message: fmt.Sprint(errors.Join(dropErr, err))})
	case denied > 0 && dropsAfter <= dropsBefore:
		out = append(out, Violation{Invariant: "policy-drop-uncounted", Object: "metrics map",
			Message: fmt.Sprintf("%d denied probe(s) did not connect, but the policy drop counters stayed at %d packets", denied, dropsBefore)})
	default:
		s.tl.Addf("probe", "%d policy probe(s) got their verdict (policy drops %d -> %d): %v", len(probes), dropsBefore, dropsAfter, probeList(probes))
	}
	return out
}

// policyDrops is the packets the datapath dropped for policy so far
// (both directions, policy and deny-list), from the pinned metrics map.
func (s *Soak) policyDrops() (uint64, error) {
	m, err := dpmaps.Open(loader.Layout{Root: s.src.bpfRoot}.Dir())
	if err != nil {
		return 0, err
	}
	defer m.Close()
	all, err := m.Metrics.Read()
	if err != nil {
		return 0, err
	}
	var n uint64
	for k, v := range all {
		if k.Reason == dpmaps.DropPolicy || k.Reason == dpmaps.DropPolicyDenyList {
			n += v.Packets
		}
	}
	return n, nil
}

func probeList(ps []probe) []string {
	var out []string
	for _, p := range ps {
		v := "deny"
		if p.want {
			v = "allow"
		}
		out = append(out, p.src+"->"+p.dst+":"+v)
	}
	return out
}

// flow is the pinned pair's long-lived TCP connection.
type flow struct {
	srv  *echoServer
	conn net.Conn
	seq  int
	ends flowEnds
	// metrics is the datapath's counters after the last good exchange,
	// the baseline of the drops a failure reports.
	metrics map[dpmaps.MetricsKey]dpmaps.MetricsValue
}

// startFlow starts the echo server in the pinned server and connects to
// it from the pinned client; both must be ready (after the initial
// quiescent point).
func (s *Soak) startFlow() error {
	sbs := s.liveSandboxes()
	srv, okS := sbs[pinnedServer]
	cli, okC := sbs[pinnedClient]
	if !okS || !okC {
		return fmt.Errorf("the pinned pods %s and %s have no ready sandboxes", pinnedServer, pinnedClient)
	}
	ip, err := netip.ParseAddr(srv.IP)
	if err != nil {
		return fmt.Errorf("pinned server IP %q: %w", srv.IP, err)
	}
	dst := netip.AddrPortFrom(ip, flowPort)
	e, err := listenIn(srv.NetnsPath, dst)
	if err != nil {
		return err
	}
	c, nsErr, err := dialIn(cli.NetnsPath, dst, allowedTimeout)
	if nsErr == nil {
		nsErr = err
	}
	if nsErr != nil {
		e.Close()
		return fmt.Errorf("connect %s -> %s (%s): %w", pinnedClient, pinnedServer, dst, nsErr)
	}
	local, _ := netip.ParseAddrPort(c.LocalAddr().String())
	s.flow = &flow{srv: e, conn: c, ends: flowEnds{cli: local, srv: dst}, metrics: s.readMetrics()}
	s.tl.Addf("flow", "pinned connection %s -> %s (%s) established from %s", pinnedClient, pinnedServer, dst, c.LocalAddr())
	return nil
}

// checkFlow exchanges one message on the pinned connection; a failure
// is a violation (once: the connection is closed then).
func (s *Soak) checkFlow(why string) *Violation {
	f := s.flow
	if f == nil {
		return nil
	}
	f.seq++
	msg := fmt.Appendf(nil, "pinned flow message %d (%s)", f.seq, why)
	began := time.Now()
	err := exchange(f.conn, msg, flowTimeout)
	s.count("flow-exchanges", 1)
	if err == nil {
		s.tl.Addf("flow", "message %d echoed in %s (%s)", f.seq, time.Since(began).Truncate(time.Microsecond), why)
		f.metrics = s.readMetrics()
		return nil
	}
	diag := s.flowDiagnosis(f.ends, f.metrics)
	s.closeFlow()
	return &Violation{Invariant: "flow-broken", Object: "connection " + pinnedClient + "->" + pinnedServer,
		Message: fmt.Sprintf("message %d (%s): %v; the established connection did not survive (datapath: %s)", f.seq, why, err, diag)}
}

// closeFlow closes the pinned connection and its server.
func (s *Soak) closeFlow() {
	if s.flow == nil {
		return
	}
	_ = s.flow.conn.Close()
	s.flow.srv.Close()
	s.flow = nil
}
