package integration

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/cilium.io/v2alpha1"
	"github.com/cellium/cellium/api/client/clientset/versioned"
	"github.com/cellium/cellium/cells/cesbatcher"
	"github.com/cellium/cellium/cells/crdregister"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/cells/leaderelection"
	"github.com/cellium/cellium/test/harness"
)

// The adversity tests run the operator's slice batcher (in process) at
// ten writes a second, five endpoints a slice, so that a round of 100
// endpoints takes about two seconds of writes: long enough to interrupt.
const (
	advMax  = 5
	advRate = `[{"nodes":0,"limit":10,"burst":1}]`
)

// retryLog is the batcher's message for a failed round.
const retryLog = "Writing CiliumEndpointSlices failed; retrying"

// countingHandler counts the records with one message and writes every
// record to the test log.
type countingHandler struct {
	slog.Handler
	msg string
	n   *atomic.Int64
}

func (h countingHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.n.Add(1)
	}
	return h.Handler.Handle(ctx, r)
}

func (h countingHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return countingHandler{h.Handler.WithAttrs(as), h.msg, h.n}
}

func (h countingHandler) WithGroup(g string) slog.Handler {
	return countingHandler{h.Handler.WithGroup(g), h.msg, h.n}
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// startBatcher starts an operator hive with the slice batcher only,
// leading at once, on kubeconfig. failedRounds counts its failed rounds.
func startBatcher(t *testing.T, ctx context.Context, kubeconfig, agent string, failedRounds *atomic.Int64) *hive.Hive {
	t.Helper()
	var out io.Writer = tWriter{t}
	log := slog.New(countingHandler{slog.NewTextHandler(out, &slog.HandlerOptions{Level: slog.LevelInfo}), retryLog, failedRounds})
	h := hive.NewWithOptions(hive.Options{Logger: log, LookupEnv: func(string) (string, bool) { return "", false }},
		k8s.ClientCell, crdregister.Cell, leaderelection.Cell, k8s.CiliumEndpointsCell, k8s.CiliumNodesCell, cesbatcher.Cell,
		hive.Provide(func() k8s.UserAgent { return k8s.UserAgent(agent) }))
	args := []string{"--k8s-kubeconfig-path=" + kubeconfig, "--leader-election=false", "--enable-cilium-endpoint-slice=true",
		fmt.Sprintf("--ces-max-ciliumendpoints-per-ces=%d", advMax), "--ces-rate-limits=" + advRate}
	if err := h.Flags().Parse(args); err != nil {
		t.Fatal(err)
	}
	if err := h.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return h
}

// advCEP is CiliumEndpoint i of ns with identity id.
func advCEP(ns string, i int, id int64) *ciliumv2.CiliumEndpoint {
	return &ciliumv2.CiliumEndpoint{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pod-%03d", i), Namespace: ns,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: fmt.Sprintf("pod-%03d", i), UID: types.UID(fmt.Sprintf("uid-%d", i))}}},
		Status: ciliumv2.EndpointStatus{ID: int64(i + 1), Identity: &ciliumv2.EndpointIdentity{ID: id}, State: ciliumv2.EndpointStateReady,
			Networking: &ciliumv2.EndpointNetworking{NodeIP: "192.0.2.11",
				Addressing: ciliumv2.AddressPairList{{IPV4: fmt.Sprintf("10.11.%d.%d", i/200, i%200+1)}}}},
	}
}

// nsSlices lists ns's slices.
func nsSlices(t *testing.T, admin versioned.Interface, ns string) []v2alpha1.CiliumEndpointSlice {
	t.Helper()
	l, err := admin.CiliumV2alpha1().CiliumEndpointSlices().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []v2alpha1.CiliumEndpointSlice
	for _, ces := range l.Items {
		if ces.Namespace == ns {
			out = append(out, ces)
		}
	}
	return out
}

// waitMidRound waits until ns has between 2 and want-4 slices (a round
// of writes under way) and fails if the round ends first.
func waitMidRound(t *testing.T, admin versioned.Interface, ns string, want int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		n := len(nsSlices(t, admin, ns))
		if n >= 2 && n <= want-4 {
			return
		}
		if n > want-4 {
			t.Fatalf("%d of %d slices written before the interruption: the round was not interrupted", n, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("no round of slice writes started")
}

// churn makes changes the next batcher must reflect: deletes pods 0-9,
// moves pods 10-19 to identity id+1 (or back), creates pods 100-109.
func churn(t *testing.T, ctx context.Context, admin versioned.Interface, ns string, base int64, spare ...string) {
	t.Helper()
	api := admin.CiliumV2().CiliumEndpoints(ns)
	for i := range 10 {
		if slices.Contains(spare, fmt.Sprintf("pod-%03d", i)) {
			continue
		}
		if err := api.Delete(ctx, fmt.Sprintf("pod-%03d", i), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 10; i < 20; i++ {
		if slices.Contains(spare, fmt.Sprintf("pod-%03d", i)) {
			continue
		}
		cur, err := api.Get(ctx, fmt.Sprintf("pod-%03d", i), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cur.Status.Identity.ID = base + (cur.Status.Identity.ID-base+1)%2
		if _, err := api.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 100; i < 110; i++ {
		if _, err := api.Create(ctx, advCEP(ns, i, base+int64(i%2)), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCESBatcherStoppedMidRound stops the batcher's operator while a
// round of slice writes is in flight (its requests cancelled), leaves
// behind what a crash can: an endpoint half-way through a move (in its
// new identity's slice and still in its old one), a slice of an endpoint
// since gone and an over-full slice duplicating entries of others (an
// empty slice cannot be left: the API server refuses one); changes the CiliumEndpoints; and starts a new operator. It
// must converge to every CiliumEndpoint in exactly one slice, of its
// identity, no slice empty or over the limit.
func TestCESBatcherStoppedMidRound(t *testing.T) {
	c := cluster.Get(t)
	ns := c.TestNamespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	opKube, err := c.OperatorKubeconfig(ctx)
	if err != nil {
		t.Fatal(err)
	}
	admin := advAdmin(t, c)
	const base = 62000
	var failed atomic.Int64
	op := startBatcher(t, ctx, opKube, "cellium-operator-ces-crash-1", &failed)
	stopped := false
	defer func() {
		if !stopped {
			_ = op.Stop(context.Background())
		}
	}()

	api := admin.CiliumV2().CiliumEndpoints(ns)
	for i := range 100 {
		if _, err := api.Create(ctx, advCEP(ns, i, base+int64(i%2)), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitMidRound(t, admin, ns, 100/advMax)
	if err := op.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	stopped = true
	written := nsSlices(t, admin, ns)
	t.Logf("stopped with %d slices written", len(written))

	// What a crash leaves behind.
	sapi := admin.CiliumV2alpha1().CiliumEndpointSlices()
	mover := written[0].Endpoints[0].Name
	cur, err := api.Get(ctx, mover, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Status.Identity.ID = base + (cur.Status.Identity.ID-base+1)%2
	if cur, err = api.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	mk := func(name string, eps ...v2alpha1.CoreCiliumEndpoint) {
		ces := &v2alpha1.CiliumEndpointSlice{Namespace: ns, Endpoints: eps}
		ces.Name = name
		if _, err := sapi.Create(ctx, ces, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	suffix := strings.TrimPrefix(ns, "test-")
	if len(suffix) > 20 {
		suffix = suffix[len(suffix)-20:]
	}
	mk("ces-crash-halfmove-"+suffix, v2alpha1.CoreFromCiliumEndpoint(cur))
	ghost := advCEP(ns, 900, base)
	mk("ces-crash-ghost-"+suffix, v2alpha1.CoreFromCiliumEndpoint(ghost))
	// Over the limit, with the written entries of one identity (now in
	// two slices) and others of that identity.
	var dup []v2alpha1.CoreCiliumEndpoint
	inDup := map[string]bool{mover: true}
	for _, ces := range written {
		for _, e := range ces.Endpoints {
			if e.IdentityID == base && !inDup[e.Name] && len(dup) < advMax+2 {
				dup, inDup[e.Name] = append(dup, e), true
			}
		}
	}
	all, err := api.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range all.Items {
		if c := &all.Items[i]; c.Status.Identity.ID == base && !inDup[c.Name] && len(dup) < advMax+2 {
			dup, inDup[c.Name] = append(dup, v2alpha1.CoreFromCiliumEndpoint(c)), true
		}
	}
	if len(dup) != advMax+2 {
		t.Fatalf("%d entries for the over-full slice", len(dup))
	}
	twice := 0
	for _, ces := range written {
		for _, e := range ces.Endpoints {
			if inDup[e.Name] && e.Name != mover {
				twice++
			}
		}
	}
	t.Logf("crash artifacts: %s half-moved, %d entries in an over-full slice (%d of them in another slice too)", mover, len(dup), twice)
	mk("ces-crash-dup-"+suffix, dup...)
	// The half-moved endpoint stays: the new operator must finish its
	// move (it is moved once more below).
	churn(t, ctx, admin, ns, base, mover)
	wantCEPs := 100
	if n, err := strconv.Atoi(strings.TrimPrefix(mover, "pod-")); err == nil && n < 10 {
		wantCEPs++ // spared from churn's deletions
	}

	op2 := startBatcher(t, ctx, opKube, "cellium-operator-ces-crash-2", &failed)
	defer func() {
		if err := op2.Stop(context.Background()); err != nil {
			t.Error(err)
		}
	}()
	checkSlices(t, admin, ns, wantCEPs, advMax)
	// The mover is in one slice, with its new identity (checkSlices), and
	// a later move by the new operator converges too.
	churn2 := func() {
		cur, err := api.Get(ctx, mover, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cur.Status.Identity.ID = base + (cur.Status.Identity.ID-base+1)%2
		if _, err := api.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	churn2()
	checkSlices(t, admin, ns, wantCEPs, advMax)
	if n := failed.Load(); n > 3 {
		t.Errorf("%d failed rounds", n)
	}
}

// TestCESBatcherAPIServerUnreachable cuts the batcher's operator off the
// API server (a loopback proxy that drops its connections and refuses
// new ones) during a round of slice writes for six seconds, changes the
// CiliumEndpoints meanwhile, and restores the path. The batcher must
// retry at its retry interval (not spin), and then converge to every
// CiliumEndpoint, including those of the outage, in exactly one slice.
func TestCESBatcherAPIServerUnreachable(t *testing.T) {
	c := cluster.Get(t)
	ns := c.TestNamespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	opKube, err := c.OperatorKubeconfig(ctx)
	if err != nil {
		t.Fatal(err)
	}
	admin := advAdmin(t, c)
	p := newCutProxy(t, strings.TrimPrefix(c.APIServerURL(), "https://"))
	kube := proxiedKubeconfig(t, opKube, c.APIServerURL(), "https://"+p.addr())
	const base = 62100
	var failed atomic.Int64
	op := startBatcher(t, ctx, kube, "cellium-operator-ces-outage", &failed)
	defer func() {
		if err := op.Stop(context.Background()); err != nil {
			t.Error(err)
		}
	}()

	api := admin.CiliumV2().CiliumEndpoints(ns)
	for i := range 100 {
		if _, err := api.Create(ctx, advCEP(ns, i, base+int64(i%2)), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitMidRound(t, admin, ns, 100/advMax)
	p.cut(true)
	t0 := time.Now()
	before := len(nsSlices(t, admin, ns))
	churn(t, ctx, admin, ns, base)
	const outage = 6 * time.Second
	time.Sleep(outage - time.Since(t0))
	during, conns := failed.Load(), p.refused.Load()
	if n := len(nsSlices(t, admin, ns)); n > before+1 {
		t.Errorf("%d slices written during the outage (%d before)", n-before, before)
	}
	p.cut(false)
	t.Logf("outage %s: %d failed rounds, %d connections refused", outage, during, conns)
	// RetryDelay is a second: a round fails at most once a second (plus
	// the one in flight). Connections: the write retries and the
	// reflectors' backoff, not a loop.
	if during < 2 || during > int64(outage/time.Second)+2 {
		t.Errorf("%d failed rounds in a %s outage, want 2..%d (one a second)", during, outage, int64(outage/time.Second)+2)
	}
	if conns > 100 {
		t.Errorf("%d connection attempts in a %s outage: a hot loop", conns, outage)
	}
	t1 := time.Now()
	checkSlices(t, admin, ns, 100, advMax)
	t.Logf("converged %s after the path came back", time.Since(t1).Round(time.Millisecond))
}

func advAdmin(t *testing.T, c *harness.Cluster) versioned.Interface {
	t.Helper()
	cfg := c.RESTConfig()
	cfg.QPS, cfg.Burst = 500, 500
	admin, err := versioned.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return admin
}

// proxiedKubeconfig writes a copy of kubeconfig with server from
// replaced by to.
func proxiedKubeconfig(t *testing.T, kubeconfig, from, to string) string {
	t.Helper()
	b, err := os.ReadFile(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), from) {
		t.Fatalf("%s does not name %s", kubeconfig, from)
	}
	out := t.TempDir() + "/kubeconfig"
	if err := os.WriteFile(out, []byte(strings.ReplaceAll(string(b), from, to)), 0o600); err != nil {
		t.Fatal(err)
	}
	return out
}

// cutProxy forwards loopback TCP connections to target until cut: then
// it closes those it holds and closes new ones at once (counted).
type cutProxy struct {
	ln      net.Listener
	target  string
	refused atomic.Int64

	mu    sync.Mutex
	down  bool
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.serve)
	t.Cleanup(func() {
		ln.Close()
		p.cut(true)
		p.wg.Wait()
	})
	return p
}

func (p *cutProxy) addr() string { return p.ln.Addr().String() }

func (p *cutProxy) serve() {
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.down {
			p.mu.Unlock()
			p.refused.Add(1)
			in.Close()
			continue
		}
		out, err := net.Dial("tcp", p.target)
		if err != nil {
			p.mu.Unlock()
			in.Close()
			continue
		}
		p.conns[in], p.conns[out] = struct{}{}, struct{}{}
		p.mu.Unlock()
		pipe := func(dst, src net.Conn) {
			_, _ = io.Copy(dst, src)
			dst.Close()
			src.Close()
			p.mu.Lock()
			delete(p.conns, dst)
			delete(p.conns, src)
			p.mu.Unlock()
		}
		p.wg.Go(func() { pipe(out, in) })
		p.wg.Go(func() { pipe(in, out) })
	}
}

// cut makes the path down (closing every connection) or up.
func (p *cutProxy) cut(down bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = down
	if down {
		for c := range p.conns {
			c.Close()
		}
	}
}
