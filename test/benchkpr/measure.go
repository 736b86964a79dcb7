package benchkpr

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/cellium/cellium/test/devkubelet/devnode"
)

// changeTimeout bounds one Service change's wait on every node.
const changeTimeout = 60 * time.Second

// measure runs every measurement of the mode.
func (b *bench) measure(ctx context.Context) (ModeResult, error) {
	m := ModeResult{Mode: b.mode}
	for _, p := range b.paths() {
		pr := PathResult{Name: p.name}
		for round := range b.cfg.Rounds {
			bps, err := b.iperf(ctx, p)
			if err != nil {
				return m, err
			}
			r, err := b.rr(ctx, p, b.cfg.RoundTrips)
			if err != nil {
				return m, fmt.Errorf("%s: %w", p.name, err)
			}
			pr.BitsPerSecond = append(pr.BitsPerSecond, bps)
			pr.RoundTripsPerSecond = append(pr.RoundTripsPerSecond, r.PerSecond)
			b.log.Info("path", "name", p.name, "round", round, "Gbit/s", fmt.Sprintf("%.2f", bps/1e9), "rr/s", fmt.Sprintf("%.0f", r.PerSecond))
		}
		m.Paths = append(m.Paths, pr)
	}
	for _, size := range b.cfg.Sizes {
		sr, err := b.atSize(ctx, size)
		if err != nil {
			return m, fmt.Errorf("at %d Services: %w", size, err)
		}
		m.Sizes = append(m.Sizes, sr)
	}
	return m, nil
}

// atSize adds Services until size are present, waits until every node
// serves the last, and measures connect latency, Service changes and
// memory.
func (b *bench) atSize(ctx context.Context, size int) (SizeResult, error) {
	sr := SizeResult{Services: size}
	began := time.Now()
	if err := b.addServices(ctx, size); err != nil {
		return sr, err
	}
	if err := b.settle(ctx, size); err != nil {
		return sr, err
	}
	sr.Settled = time.Since(began)
	b.log.Info("services present", "n", size, "took", sr.Settled.Round(time.Millisecond))

	clientNode := b.c.Nodes[0]
	r, err := b.probe(ctx, b.clientNetns, clientNode, "connect", "-addr", netip.AddrPortFrom(b.clusterIP, httpPort).String(),
		"-n", strconv.Itoa(b.cfg.Connects), "-timeout", "1s")
	if err != nil {
		return sr, err
	}
	sr.Connect = r

	var ws []*watcher
	defer func() {
		for _, w := range ws {
			w.stop()
		}
	}()
	for i := range b.c.Nodes {
		w, err := b.startWatcher(ctx, i)
		if err != nil {
			return sr, err
		}
		ws = append(ws, w)
	}
	// The watchers see the Service without its backend first.
	for _, w := range ws {
		if _, err := w.wait(time.Time{}, false, changeTimeout); err != nil {
			return sr, err
		}
	}
	up := false
	for i := range b.cfg.Changes {
		up = !up
		var backend *netip.Addr
		if up {
			backend = &b.serverIP
		}
		at := time.Now()
		if _, err := b.cs.DiscoveryV1().EndpointSlices(namespace).Update(ctx, b.changeSlice(backend), metav1.UpdateOptions{}); err != nil {
			return sr, fmt.Errorf("change %d: %w", i, err)
		}
		var last time.Time
		for j, w := range ws {
			t, err := w.wait(at, up, changeTimeout)
			if err != nil {
				return sr, fmt.Errorf("change %d (backend %v) on node %s: %w", i, up, b.c.Nodes[j].Name, err)
			}
			if t.After(last) {
				last = t
			}
		}
		sr.Changes = append(sr.Changes, last.Sub(at))
		// Apart, as Services change in a cluster (not a burst).
		time.Sleep(100 * time.Millisecond)
	}
	slices.Sort(sr.Changes)
	sr.Memory, err = b.memory()
	if err != nil {
		return sr, err
	}
	b.log.Info("measured", "services", size, "connect p50", time.Duration(sr.Connect.P50), "change p99", percentile(sr.Changes, 99))
	return sr, nil
}

// addServices creates ClusterIP Services (no selector) with one
// EndpointSlice of BackendsPerService ready endpoints each, at addresses
// that are never contacted, until size bulk Services exist. The
// benchmark's own two Services are not counted.
func (b *bench) addServices(ctx context.Context, size int) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	next := make(chan int)
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for i := range next {
				if err := b.addService(ctx, i); err != nil {
					cancel(err)
				}
			}
		})
	}
	for i := b.services; i < size && ctx.Err() == nil; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return err
	}
	b.services = max(b.services, size)
	return nil
}

func (b *bench) addService(ctx context.Context, i int) error {
	name := fmt.Sprintf("bulk-%05d", i)
	_, err := b.cs.CoreV1().Services(namespace).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("service %s: %w", name, err)
	}
	addrs, port := bulkBackends(i, b.cfg.BackendsPerService)
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: "bench-kpr"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: new("http"), Port: new(port), Protocol: new(corev1.ProtocolTCP)}},
	}
	for _, a := range addrs {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{a.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: new(true), Serving: new(true), Terminating: new(false)}})
	}
	if _, err := b.cs.DiscoveryV1().EndpointSlices(namespace).Create(ctx, s, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("slice %s: %w", name, err)
	}
	return nil
}

// bulkBase is where the bulk Services' backends are: inside the pod CIDR
// (realnode.DefaultPodCIDR) but above every node's pod range, so nothing
// answers there and nothing is ever sent there (no client connects to
// the bulk Services).
var bulkBase = netip.MustParseAddr("10.236.64.0")

// bulkSpan is the number of addresses the bulk backends use (a /18).
const bulkSpan = 1 << 14

// bulkBackends are bulk Service i's n backend addresses and their port:
// every Service's distinct from every other's (address and port).
func bulkBackends(i, n int) ([]netip.Addr, int32) {
	perPort := bulkSpan / n
	first := (i % perPort) * n
	base := bulkBase.As4()
	out := make([]netip.Addr, n)
	for j := range n {
		k := uint32(first + j)
		a := base
		a[2] += byte(k >> 8)
		a[3] += byte(k)
		out[j] = netip.AddrFrom4(a)
	}
	return out, int32(10000 + i/perPort)
}

// settle creates (once per size) a Service with the server pod as its
// backend after the bulk ones, and waits until a client pod of every node
// reaches it: the Services before it are then served too (kube-proxy
// syncs everything at once; cellium derives Services in the order of
// their changes).
func (b *bench) settle(ctx context.Context, size int) error {
	name := fmt.Sprintf("settle-%d", size)
	got, err := b.cs.CoreV1().Services(namespace).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": serverPod},
			Ports: []corev1.ServicePort{{Name: "http", Port: httpPort, TargetPort: intstr.FromInt32(httpPort)}}},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("service %s: %w", name, err)
	}
	addr := netip.AddrPortFrom(netip.MustParseAddr(got.Spec.ClusterIP), httpPort).String()
	wctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	return devnode.WaitFor(wctx, nil, func() error {
		for i, n := range b.c.Nodes {
			if _, err := b.probe(wctx, b.watchNetns[i], n, "connect", "-addr", addr, "-n", "1", "-timeout", "200ms"); err != nil {
				return fmt.Errorf("node %s: %w", n.Name, err)
			}
		}
		return nil
	})
}

// memory reads the resident memory of each node's cellium-agent and
// kube-proxy and the load balancer maps' entries and memory.
func (b *bench) memory() (Memory, error) {
	var m Memory
	for _, n := range b.c.Nodes {
		agent, err := rssOf("cellium-agent", n.Namespaces().NetnsPath())
		if err != nil {
			return m, fmt.Errorf("node %s: %w", n.Name, err)
		}
		m.AgentRSS = max(m.AgentRSS, agent)
		if b.mode == ModeKubeProxy {
			kp, err := rssOf("kube-proxy", n.Namespaces().NetnsPath())
			if err != nil {
				return m, fmt.Errorf("node %s: %w", n.Name, err)
			}
			m.KubeProxyRSS = max(m.KubeProxyRSS, kp)
		}
	}
	var err error
	m.Maps, err = lbMaps()
	return m, err
}

// rssOf is the resident memory in bytes of the process named comm whose
// network namespace is the one pinned at netnsPath.
func rssOf(comm, netnsPath string) (uint64, error) {
	want, err := nsID(netnsPath)
	if err != nil {
		return 0, err
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		dir := filepath.Join("/proc", e.Name())
		c, err := os.ReadFile(filepath.Join(dir, "comm"))
		if err != nil || strings.TrimSpace(string(c)) != comm {
			continue
		}
		if id, err := nsID(filepath.Join(dir, "ns", "net")); err != nil || id != want {
			continue
		}
		status, err := os.ReadFile(filepath.Join(dir, "status"))
		if err != nil {
			continue
		}
		for line := range strings.Lines(string(status)) {
			if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				f := strings.Fields(rest)
				kb, err := strconv.ParseUint(f[0], 10, 64)
				if err != nil {
					return 0, fmt.Errorf("%s VmRSS %q: %w", dir, rest, err)
				}
				return kb * 1024, nil
			}
		}
	}
	return 0, fmt.Errorf("no %s process in %s", comm, netnsPath)
}

// nsID identifies a namespace file by device and inode.
func nsID(p string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return "", fmt.Errorf("stat %s: %w", p, err)
	}
	return fmt.Sprintf("%d:%d", st.Dev, st.Ino), nil
}

// lbMaps are the load balancer's maps on this machine (every node's), by
// name: entries and memory of the largest of each name.
func lbMaps() (map[string]MapSize, error) {
	out := map[string]MapSize{}
	id := ebpf.MapID(0)
	for {
		next, err := ebpf.MapGetNextID(id)
		if errors.Is(err, os.ErrNotExist) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		id = next
		m, err := ebpf.NewMapFromID(id)
		if err != nil {
			continue
		}
		info, err := m.Info()
		if err != nil || !strings.HasPrefix(info.Name, "cellium_lb4_") {
			m.Close()
			continue
		}
		n := 0
		var key []byte
		it := m.Iterate()
		var val []byte
		for it.Next(&key, &val) {
			n++
		}
		mem, _ := info.Memlock()
		if cur := out[info.Name]; n >= cur.Entries {
			out[info.Name] = MapSize{Entries: n, MaxEntries: int(info.MaxEntries), Bytes: mem}
		}
		m.Close()
	}
}
