package install_test

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"

	hubblemetrics "github.com/cellium/cellium/cells/hubble/metrics"
	"github.com/cellium/cellium/install"
)

func find(t *testing.T, objs []*unstructured.Unstructured, kind, name string, into any) bool {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, into); err != nil {
				t.Fatal(err)
			}
			return true
		}
	}
	return false
}

// hubble.metrics.enabled gives the agents --hubble-metrics-server and a
// --hubble-metrics the agent accepts, the hubble-metrics container port, a
// headless Service with Prometheus' annotations selecting the agents, and,
// with dashboards.enabled, the dashboard in a ConfigMap for Grafana.
func TestChartHubbleMetrics(t *testing.T) {
	h, root := helm(t), repoRoot(t)
	out, err := install.RenderWith(t.Context(), h, root,
		"hubble.metrics.enabled={drop,tcp,flow,port-distribution,policy:sourceContext=pod;destinationContext=pod}",
		"hubble.metrics.port=9966",
		"hubble.metrics.serviceAnnotations.team=net",
		"hubble.metrics.dashboards.enabled=true")
	if err != nil {
		t.Fatal(err)
	}
	objs, err := install.Objects(out)
	if err != nil {
		t.Fatal(err)
	}

	var ds appsv1.DaemonSet
	if !find(t, objs, "DaemonSet", "cellium-agent", &ds) {
		t.Fatal("no DaemonSet cellium-agent")
	}
	agent := ds.Spec.Template.Spec.Containers[0]
	if !slices.Contains(agent.Args, "--hubble-metrics-server=:9966") {
		t.Errorf("agent args %v lack --hubble-metrics-server=:9966", agent.Args)
	}
	var list string
	for _, a := range agent.Args {
		if v, ok := strings.CutPrefix(a, "--hubble-metrics="); ok {
			list = v
		}
	}
	specs, err := hubblemetrics.ParseSpecs(list)
	if err != nil {
		t.Errorf("the agent refuses the chart's --hubble-metrics=%q: %v", list, err)
	} else if len(specs) != 5 {
		t.Errorf("--hubble-metrics=%q enables %d metrics, want 5", list, len(specs))
	}
	if !slices.ContainsFunc(agent.Ports, func(p corev1.ContainerPort) bool {
		return p.Name == "hubble-metrics" && p.ContainerPort == 9966 && p.HostPort == 9966
	}) {
		t.Errorf("agent ports %+v lack hubble-metrics 9966", agent.Ports)
	}

	var svc corev1.Service
	if !find(t, objs, "Service", "hubble-metrics", &svc) {
		t.Fatal("no Service hubble-metrics")
	}
	if svc.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("Service hubble-metrics clusterIP %q, want None (headless: one endpoint per agent)", svc.Spec.ClusterIP)
	}
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 9966 || svc.Spec.Ports[0].TargetPort.String() != "hubble-metrics" {
		t.Errorf("Service hubble-metrics ports %+v, want 9966 -> hubble-metrics", svc.Spec.Ports)
	}
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(ds.Spec.Template.Labels)) {
		t.Errorf("Service selector %v does not select the agent pods %v", svc.Spec.Selector, ds.Spec.Template.Labels)
	}
	for k, v := range map[string]string{"prometheus.io/scrape": "true", "prometheus.io/port": "9966", "team": "net"} {
		if svc.Annotations[k] != v {
			t.Errorf("Service annotation %s=%q, want %q", k, svc.Annotations[k], v)
		}
	}

	var cm corev1.ConfigMap
	if !find(t, objs, "ConfigMap", "hubble-dashboard", &cm) {
		t.Fatal("no ConfigMap hubble-dashboard")
	}
	if cm.Labels["grafana_dashboard"] != "1" {
		t.Errorf("ConfigMap labels %v lack grafana_dashboard=1", cm.Labels)
	}
	file, err := os.ReadFile(filepath.Join(root, install.ChartDir, "files/dashboards/hubble-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	if got := cm.Data["hubble-dashboard.json"]; !bytes.Equal(bytes.TrimSpace([]byte(got)), bytes.TrimSpace(file)) {
		t.Errorf("the ConfigMap's dashboard differs from files/dashboards/hubble-dashboard.json")
	}

	// The defaults render none of it (the committed manifests).
	def, err := install.RenderWith(t.Context(), h, root)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"hubble-metrics", "hubble-dashboard"} {
		if bytes.Contains(def, []byte(s)) {
			t.Errorf("the chart's defaults render %s", s)
		}
	}
}
