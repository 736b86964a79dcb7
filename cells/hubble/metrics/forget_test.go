package metrics_test

import (
	"strings"
	"testing"
	"time"

	"github.com/cilium/statedb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/hubble"
	"github.com/cellium/cellium/cells/hubble/metrics"
	k8stables "github.com/cellium/cellium/statedb/k8s"
)

func gathered(t *testing.T, m *metrics.Metrics) string {
	t.Helper()
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, mf := range mfs {
		for _, s := range mf.GetMetric() {
			b.WriteString(mf.GetName())
			for _, l := range s.GetLabel() {
				b.WriteString(" " + l.GetName() + "=" + l.GetValue())
			}
			b.WriteString("\n")
		}
	}
	return b.String()
}

// ForgetPod removes the series naming the pod through the pod context and
// labelsContext's pod and namespace, and keeps the others.
func TestForgetPod(t *testing.T) {
	m := newMetrics(t, "policy:sourceContext=pod;destinationContext=pod "+
		"flow:labelsContext=source_namespace,source_pod,destination_namespace,destination_pod drop:sourceContext=namespace")
	feed(m, conversation)
	before := gathered(t, m)
	if !strings.Contains(before, "web-1") {
		t.Fatalf("no series names web-1:\n%s", before)
	}
	if n := m.ForgetPod("demo", "web-1"); n == 0 {
		t.Fatal("ForgetPod(demo, web-1) deleted nothing")
	}
	after := gathered(t, m)
	if strings.Contains(after, "web-1") {
		t.Errorf("series still name web-1:\n%s", after)
	}
	for _, keep := range []string{
		"hubble_flows_processed_total destination_namespace=kube-system destination_pod=coredns-5d78c",
		"hubble_drop_total protocol=TCP reason=POLICY_DENIED source=demo",
	} {
		if !strings.Contains(after, keep) {
			t.Errorf("lost the series %q:\n%s", keep, after)
		}
	}
	if n := m.ForgetPod("other", "web-1"); n != 0 {
		t.Errorf("ForgetPod of a pod never seen deleted %d series", n)
	}
}

// A deleted pod's series go after the grace period, not before, and not
// if the pod is created again meanwhile.
func TestForgetterGrace(t *testing.T) {
	m := newMetrics(t, "policy:sourceContext=pod;destinationContext=pod")
	feed(m, conversation)
	f := metrics.NewForgetter(m, time.Minute)
	t0 := time.Unix(1000, 0)
	f.Deleted("demo", "web-1", t0)
	if n := f.Forget(t0.Add(59 * time.Second)); n != 0 || f.Pending() != 1 {
		t.Errorf("within the grace period: forgot %d series, %d pending; want 0, 1", n, f.Pending())
	}
	f.Exists("demo", "web-1")
	if n := f.Forget(t0.Add(2 * time.Minute)); n != 0 || f.Pending() != 0 {
		t.Errorf("pod created again: forgot %d series, %d pending; want 0, 0", n, f.Pending())
	}
	f.Deleted("demo", "web-1", t0)
	if n := f.Forget(t0.Add(time.Minute)); n != 2 || f.Pending() != 0 {
		t.Errorf("after the grace period: forgot %d series, %d pending; want 2, 0", n, f.Pending())
	}
}

// In the hive, deleting a pod's CiliumEndpoint removes its series from
// /metrics once the grace period is over.
func TestCellForgetsDeletedPods(t *testing.T) {
	addr := freeAddr(t)
	var (
		in   hubble.SinksIn
		db   *statedb.DB
		ceps statedb.RWTable[*ciliumv2.CiliumEndpoint]
	)
	hivetest.Start(t, []string{"--hubble-metrics-server=" + addr, "--hubble-metrics=policy:sourceContext=pod;destinationContext=pod"},
		metrics.Cell, metrics.WithForgetTiming(200*time.Millisecond, 50*time.Millisecond),
		hive.Provide(k8stables.NewCiliumEndpointsTable, statedb.RWTable[*ciliumv2.CiliumEndpoint].ToTable),
		hivetest.Capture(&in), hivetest.Capture(&db), hivetest.Capture(&ceps))
	web := &ciliumv2.CiliumEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "web-1"}}
	wtxn := db.WriteTxn(ceps)
	if _, _, err := ceps.Insert(wtxn, web); err != nil {
		t.Fatal(err)
	}
	wtxn.Commit()
	for _, f := range conversation {
		in.Sinks[0].OnFlow(f)
	}
	if body := scrape(t, addr); !strings.Contains(body, `destination="demo/web-1"`) {
		t.Fatalf("/metrics does not name web-1:\n%s", body)
	}
	wtxn = db.WriteTxn(ceps)
	if _, _, err := ceps.Delete(wtxn, web); err != nil {
		t.Fatal(err)
	}
	wtxn.Commit()
	deadline := time.Now().Add(10 * time.Second)
	for {
		body := scrape(t, addr)
		if !strings.Contains(body, "web-1") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("10s after its CiliumEndpoint was deleted, /metrics still names web-1:\n%s", body)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
