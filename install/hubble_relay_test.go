package install_test

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"os/exec"
	"path"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/hubble/observer"
	"github.com/cellium/cellium/install"
	"github.com/cellium/cellium/operator"
	"github.com/cellium/cellium/test/harness"
)

// renderObjects renders the chart with values and decodes it.
func renderObjects(t *testing.T, set ...string) []*unstructured.Unstructured {
	t.Helper()
	out, err := install.RenderWith(t.Context(), helm(t), repoRoot(t), set...)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := install.Objects(out)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func fromUnstructured(o *unstructured.Unstructured, into any) error {
	return runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, into)
}

// projectedFiles maps each file a pod's projected volume puts under a
// container's mount to the Secret and key it comes from
// ("secret/key").
func projectedFiles(spec corev1.PodSpec, c corev1.Container) map[string]string {
	files := map[string]string{}
	for _, m := range c.VolumeMounts {
		for _, v := range spec.Volumes {
			if v.Name != m.Name || v.Projected == nil {
				continue
			}
			for _, src := range v.Projected.Sources {
				if src.Secret == nil {
					continue
				}
				for _, it := range src.Secret.Items {
					files[path.Join(m.MountPath, it.Path)] = src.Secret.Name + "/" + it.Key
				}
			}
		}
	}
	return files
}

// secretCert decodes the PEM certificate in key of a Secret.
func secretCert(t *testing.T, s corev1.Secret, key string) *x509.Certificate {
	t.Helper()
	b, _ := pem.Decode(s.Data[key])
	if b == nil {
		t.Fatalf("Secret %s: %s holds no PEM block", s.Name, key)
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatalf("Secret %s %s: %v", s.Name, key, err)
	}
	return c
}

// TestChartHubbleRelay renders the chart with hubble.relay.enabled and a
// cluster name with a dot: the certificates Helm issues work together (a
// real TLS handshake between the relay's client certificate and the
// agents' server certificate, with the server name the agent's Peer
// service announces for a node and the one the relay uses for the peer
// Service), every file the agent's TLS flags and the relay's
// configuration name is one a mounted Secret provides, the hubble-peer
// Service leads port 443 to the agents' 4244, the relay's ServiceAccount
// has no token and no role, its Service is port 80 to its 4245, and the
// agent's container tells the hubble CLI where the socket is.
func TestChartHubbleRelay(t *testing.T) {
	const cluster = "c1.example"
	objs := renderObjects(t, "hubble.relay.enabled=true", "clusterName="+cluster)

	secrets := map[string]corev1.Secret{}
	for _, name := range []string{"cilium-ca", "hubble-server-certs", "hubble-relay-client-certs"} {
		var s corev1.Secret
		if !find(t, objs, "Secret", name, &s) {
			t.Fatalf("no Secret %s", name)
		}
		// helm template writes data as base64 strings; the converter
		// decodes them into bytes.
		secrets[name] = s
	}
	var none corev1.Secret
	if find(t, objs, "Secret", "hubble-relay-server-certs", &none) {
		t.Error("hubble-relay-server-certs rendered without hubble.relay.tls.server.enabled")
	}
	for _, name := range []string{"hubble-server-certs", "hubble-relay-client-certs"} {
		if secrets[name].Type != corev1.SecretTypeTLS {
			t.Errorf("Secret %s type %q, want %s", name, secrets[name].Type, corev1.SecretTypeTLS)
		}
	}
	ca := secretCert(t, secrets["cilium-ca"], "ca.crt")
	if !ca.IsCA {
		t.Errorf("cilium-ca ca.crt is not a CA")
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	server := secretCert(t, secrets["hubble-server-certs"], "tls.crt")
	if want := "*.c1-example.hubble-grpc.cilium.io"; server.Subject.CommonName != want || !slices.Contains(server.DNSNames, want) {
		t.Errorf("server certificate CN %q SANs %v, want %s", server.Subject.CommonName, server.DNSNames, want)
	}
	client := secretCert(t, secrets["hubble-relay-client-certs"], "tls.crt")
	if client.Subject.CommonName != "*.hubble-relay.cilium.io" {
		t.Errorf("relay client certificate CN %q", client.Subject.CommonName)
	}
	for _, name := range []string{"hubble-server-certs", "hubble-relay-client-certs"} {
		if got := secretCert(t, secrets[name], "ca.crt"); !got.Equal(ca) {
			t.Errorf("Secret %s: ca.crt is not cilium-ca's", name)
		}
	}

	// A handshake as the relay makes them: to a node by the name the Peer
	// service announces, and to the peer Service by the name the relay
	// gives it (hubble-peer.<cluster>...).
	keyPair := func(s corev1.Secret) tls.Certificate {
		kp, err := tls.X509KeyPair(s.Data["tls.crt"], s.Data["tls.key"])
		if err != nil {
			t.Fatalf("Secret %s: %v", s.Name, err)
		}
		return kp
	}
	serverKP, clientKP := keyPair(secrets["hubble-server-certs"]), keyPair(secrets["hubble-relay-client-certs"])
	for _, name := range []string{observer.TLSServerName("node-1.zone", cluster), observer.TLSServerName("hubble-peer", cluster)} {
		a, b := net.Pipe()
		srv := tls.Server(a, &tls.Config{Certificates: []tls.Certificate{serverKP}, ClientCAs: pool,
			ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13})
		cli := tls.Client(b, &tls.Config{Certificates: []tls.Certificate{clientKP}, RootCAs: pool,
			ServerName: name, MinVersion: tls.VersionTLS13})
		errc := make(chan error, 1)
		go func() { errc <- srv.HandshakeContext(t.Context()) }()
		if err := cli.HandshakeContext(t.Context()); err != nil {
			t.Errorf("relay -> agent as %s: %v", name, err)
		}
		if err := <-errc; err != nil {
			t.Errorf("agent <- relay as %s: %v", name, err)
		}
		cli.Close()
		srv.Close()
	}

	// The agent: the TCP listener with TLS, every file it names mounted
	// from hubble-server-certs, the port on the node, HUBBLE_SERVER.
	var ds appsv1.DaemonSet
	if !find(t, objs, "DaemonSet", "cellium-agent", &ds) {
		t.Fatal("no DaemonSet cellium-agent")
	}
	agent := ds.Spec.Template.Spec.Containers[0]
	files := projectedFiles(ds.Spec.Template.Spec, agent)
	wantFiles := map[string]string{
		"--hubble-tls-cert-file":       "hubble-server-certs/tls.crt",
		"--hubble-tls-key-file":        "hubble-server-certs/tls.key",
		"--hubble-tls-client-ca-files": "hubble-server-certs/ca.crt",
	}
	if !slices.Contains(agent.Args, "--hubble-listen-address=:4244") {
		t.Errorf("agent args %v lack --hubble-listen-address=:4244", agent.Args)
	}
	for flag, want := range wantFiles {
		var got string
		for _, a := range agent.Args {
			if v, ok := strings.CutPrefix(a, flag+"="); ok {
				got = v
			}
		}
		if got == "" || files[got] != want {
			t.Errorf("agent %s=%q: the mounted file is %q, want %s (mounted: %v)", flag, got, files[got], want, files)
		}
	}
	if slices.Contains(agent.Args, "--hubble-disable-tls") {
		t.Error("agent args have --hubble-disable-tls with hubble.tls.enabled")
	}
	if !slices.ContainsFunc(agent.Ports, func(p corev1.ContainerPort) bool {
		return p.Name == "peer-service" && p.ContainerPort == 4244 && p.HostPort == 4244
	}) {
		t.Errorf("agent ports %+v lack peer-service 4244", agent.Ports)
	}
	env := map[string]string{}
	for _, e := range agent.Env {
		env[e.Name] = e.Value
	}
	if env["HUBBLE_SERVER"] != "unix:///var/run/cellium/hubble.sock" {
		t.Errorf("agent HUBBLE_SERVER=%q, want the socket beside cellium.sock (the agent's --hubble-socket-path default)", env["HUBBLE_SERVER"])
	}

	// hubble-peer: 443 -> the agents' 4244, on the relay's own node.
	var peer corev1.Service
	if !find(t, objs, "Service", "hubble-peer", &peer) {
		t.Fatal("no Service hubble-peer")
	}
	if len(peer.Spec.Ports) != 1 || peer.Spec.Ports[0].Port != 443 || peer.Spec.Ports[0].TargetPort.IntValue() != 4244 {
		t.Errorf("hubble-peer ports %+v, want 443 -> 4244", peer.Spec.Ports)
	}
	if !labels.SelectorFromSet(peer.Spec.Selector).Matches(labels.Set(ds.Spec.Template.Labels)) {
		t.Errorf("hubble-peer selector %v does not select the agents %v", peer.Spec.Selector, ds.Spec.Template.Labels)
	}
	if p := peer.Spec.InternalTrafficPolicy; p == nil || *p != corev1.ServiceInternalTrafficPolicyLocal {
		t.Errorf("hubble-peer internalTrafficPolicy %v, want Local", p)
	}

	// The relay: its configuration, files, account, Service.
	var cm corev1.ConfigMap
	if !find(t, objs, "ConfigMap", "hubble-relay-config", &cm) {
		t.Fatal("no ConfigMap hubble-relay-config")
	}
	var cfg map[string]any
	if err := yaml.Unmarshal([]byte(cm.Data["config.yaml"]), &cfg); err != nil {
		t.Fatalf("relay config.yaml: %v\n%s", err, cm.Data["config.yaml"])
	}
	for k, want := range map[string]any{
		"peer-service":       "hubble-peer.kube-system.svc.cluster.local.:443",
		"cluster-name":       cluster,
		"listen-address":     ":4245",
		"disable-server-tls": true,
	} {
		if cfg[k] != want {
			t.Errorf("relay config %s = %v, want %v", k, cfg[k], want)
		}
	}
	var dep appsv1.Deployment
	if !find(t, objs, "Deployment", "hubble-relay", &dep) {
		t.Fatal("no Deployment hubble-relay")
	}
	pod := dep.Spec.Template.Spec
	relay := pod.Containers[0]
	relayFiles := projectedFiles(pod, relay)
	for k, want := range map[string]string{
		"tls-hubble-client-cert-file": "hubble-relay-client-certs/tls.crt",
		"tls-hubble-client-key-file":  "hubble-relay-client-certs/tls.key",
		"tls-hubble-server-ca-files":  "hubble-relay-client-certs/ca.crt",
	} {
		f, _ := cfg[k].(string)
		if relayFiles[f] != want {
			t.Errorf("relay config %s=%q: the mounted file is %q, want %s (mounted: %v)", k, f, relayFiles[f], want, relayFiles)
		}
	}
	if !slices.ContainsFunc(relay.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == "/etc/hubble-relay" }) {
		t.Errorf("relay mounts %+v: no /etc/hubble-relay (where hubble-relay reads config.yaml)", relay.VolumeMounts)
	}
	if !slices.Equal(relay.Command, []string{"hubble-relay"}) || !slices.Equal(relay.Args, []string{"serve"}) {
		t.Errorf("relay runs %v %v, want hubble-relay serve", relay.Command, relay.Args)
	}
	if relay.Image != "quay.io/cilium/hubble-relay:v1.20.2" {
		t.Errorf("relay image %s", relay.Image)
	}
	if sc := relay.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("relay securityContext %+v: want non-root with a read-only root", sc)
	}
	if pod.ServiceAccountName != "hubble-relay" || pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Errorf("relay account %q automount %v: want hubble-relay without a token", pod.ServiceAccountName, pod.AutomountServiceAccountToken)
	}
	var sa corev1.ServiceAccount
	if !find(t, objs, "ServiceAccount", "hubble-relay", &sa) || sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
		t.Errorf("ServiceAccount hubble-relay missing or mounting its token: %+v", sa)
	}
	for _, o := range objs {
		if k := o.GetKind(); k != "RoleBinding" && k != "ClusterRoleBinding" {
			continue
		}
		var b rbacv1.ClusterRoleBinding
		if err := fromUnstructured(o, &b); err != nil {
			t.Fatal(err)
		}
		for _, s := range b.Subjects {
			if s.Name == "hubble-relay" {
				t.Errorf("%s %s grants hubble-relay a role: the relay reads nothing from the API server", o.GetKind(), o.GetName())
			}
		}
	}
	if !slices.ContainsFunc(relay.Ports, func(p corev1.ContainerPort) bool { return p.Name == "grpc" && p.ContainerPort == 4245 }) {
		t.Errorf("relay ports %+v lack grpc 4245", relay.Ports)
	}
	var rsvc corev1.Service
	if !find(t, objs, "Service", "hubble-relay", &rsvc) {
		t.Fatal("no Service hubble-relay")
	}
	if len(rsvc.Spec.Ports) != 1 || rsvc.Spec.Ports[0].Port != 80 || rsvc.Spec.Ports[0].TargetPort.String() != "grpc" {
		t.Errorf("hubble-relay Service ports %+v, want 80 -> grpc", rsvc.Spec.Ports)
	}
	if !labels.SelectorFromSet(rsvc.Spec.Selector).Matches(labels.Set(dep.Spec.Template.Labels)) {
		t.Errorf("hubble-relay Service selector %v does not select the relay %v", rsvc.Spec.Selector, dep.Spec.Template.Labels)
	}

	// Every key of the relay's configuration is a flag of the upstream
	// hubble-relay serve (when the binary is cached: make hubble-binaries).
	if bins, ok := harness.CachedHubble(); ok {
		help, err := exec.CommandContext(t.Context(), bins.Relay, "serve", "--help").CombinedOutput()
		if err != nil {
			t.Fatalf("hubble-relay serve --help: %v\n%s", err, help)
		}
		for k := range cfg {
			if !strings.Contains(string(help), "--"+k+" ") {
				t.Errorf("relay config key %s is not a flag of hubble-relay serve %s", k, bins.Version)
			}
		}
	} else {
		t.Log("hubble-relay is not cached (make hubble-binaries): its flags are not checked")
	}
}

// TestChartHubbleRelayServerTLS: hubble.relay.tls.server.enabled gives the
// relay a server certificate for *.hubble-relay.cilium.io, its
// configuration names the mounted files, and its Service listens on 443.
func TestChartHubbleRelayServerTLS(t *testing.T) {
	objs := renderObjects(t, "hubble.relay.enabled=true", "hubble.relay.tls.server.enabled=true")
	var s corev1.Secret
	if !find(t, objs, "Secret", "hubble-relay-server-certs", &s) {
		t.Fatal("no Secret hubble-relay-server-certs")
	}
	if c := secretCert(t, s, "tls.crt"); !slices.Contains(c.DNSNames, "*.hubble-relay.cilium.io") {
		t.Errorf("relay server certificate SANs %v", c.DNSNames)
	}
	var cm corev1.ConfigMap
	find(t, objs, "ConfigMap", "hubble-relay-config", &cm)
	var cfg map[string]any
	if err := yaml.Unmarshal([]byte(cm.Data["config.yaml"]), &cfg); err != nil {
		t.Fatal(err)
	}
	var dep appsv1.Deployment
	find(t, objs, "Deployment", "hubble-relay", &dep)
	files := projectedFiles(dep.Spec.Template.Spec, dep.Spec.Template.Spec.Containers[0])
	for k, want := range map[string]string{
		"tls-relay-server-cert-file": "hubble-relay-server-certs/tls.crt",
		"tls-relay-server-key-file":  "hubble-relay-server-certs/tls.key",
	} {
		f, _ := cfg[k].(string)
		if files[f] != want {
			t.Errorf("relay config %s=%q: mounted file %q, want %s", k, f, files[f], want)
		}
	}
	if _, ok := cfg["disable-server-tls"]; ok {
		t.Errorf("relay config has disable-server-tls with tls.server.enabled")
	}
	var svc corev1.Service
	find(t, objs, "Service", "hubble-relay", &svc)
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 443 {
		t.Errorf("hubble-relay Service ports %+v, want 443", svc.Spec.Ports)
	}
}

// TestChartHubbleWithoutTLS: hubble.tls.enabled=false serves the agents'
// listener in plain text (--hubble-disable-tls), the peer Service on port
// 80, the relay with disable-client-tls, and issues no certificate.
func TestChartHubbleWithoutTLS(t *testing.T) {
	objs := renderObjects(t, "hubble.relay.enabled=true", "hubble.tls.enabled=false")
	for _, o := range objs {
		if o.GetKind() == "Secret" {
			t.Errorf("Secret %s rendered without TLS", o.GetName())
		}
	}
	var ds appsv1.DaemonSet
	find(t, objs, "DaemonSet", "cellium-agent", &ds)
	args := ds.Spec.Template.Spec.Containers[0].Args
	if !slices.Contains(args, "--hubble-disable-tls") || slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--hubble-tls-") }) {
		t.Errorf("agent args %v: want --hubble-disable-tls and no --hubble-tls-*", args)
	}
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.Name == "hubble-tls" {
			t.Error("agent mounts hubble-tls without TLS")
		}
	}
	var peer corev1.Service
	find(t, objs, "Service", "hubble-peer", &peer)
	if len(peer.Spec.Ports) != 1 || peer.Spec.Ports[0].Port != 80 {
		t.Errorf("hubble-peer ports %+v, want 80", peer.Spec.Ports)
	}
	var cm corev1.ConfigMap
	find(t, objs, "ConfigMap", "hubble-relay-config", &cm)
	var cfg map[string]any
	if err := yaml.Unmarshal([]byte(cm.Data["config.yaml"]), &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg["disable-client-tls"] != true || cfg["peer-service"] != "hubble-peer.kube-system.svc.cluster.local.:80" {
		t.Errorf("relay config %v: want disable-client-tls and the peer Service on 80", cfg)
	}
}

// TestChartHubbleBadValues: values that cannot work are refused with what
// to do, never rendered.
func TestChartHubbleBadValues(t *testing.T) {
	h, root := helm(t), repoRoot(t)
	for _, tc := range []struct {
		set  []string
		want string
	}{
		{[]string{"hubble.tls.auto.method=certmanager"}, "issues the Hubble certificates with Helm only: set hubble.tls.auto.method=helm"},
		{[]string{"hubble.listenAddress=:4000"}, `hubble.listenAddress=":4000" and hubble.peerService.targetPort=4244 disagree`},
		{[]string{"hubble.listenAddress=", "hubble.relay.enabled=true"}, "hubble.relay.enabled needs the agents' Hubble API on TCP: set hubble.listenAddress"},
		{[]string{"hubble.serviceMap.enabled=true"}, "hubble.serviceMap.enabled draws the flows of hubble-relay: set hubble.relay.enabled=true too"},
		{[]string{"hubble.serviceMap.enabled=true", "hubble.relay.enabled=true", "hubble.relay.tls.server.enabled=true"}, "hubble.serviceMap.enabled reads hubble-relay in plain text: set hubble.relay.tls.server.enabled=false"},
	} {
		_, err := install.RenderWith(t.Context(), h, root, tc.set...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("--set %v: error %v, want one saying %q", tc.set, err, tc.want)
		}
	}
}

// TestChartHubbleDefaults: by default (Cilium's) the agents listen on
// :4244 with TLS and the chart issues their certificate, but deploys no
// relay; the committed plain manifests ([install.ManifestsValues]) carry
// no listener, no Secret and no private key.
func TestChartHubbleDefaults(t *testing.T) {
	objs := renderObjects(t)
	var s corev1.Secret
	if !find(t, objs, "Secret", "hubble-server-certs", &s) {
		t.Error("the defaults issue no hubble-server-certs")
	}
	for _, o := range objs {
		if strings.HasPrefix(o.GetName(), "hubble-relay") {
			t.Errorf("the defaults render %s %s (hubble.relay.enabled defaults to false)", o.GetKind(), o.GetName())
		}
	}
	committed, err := install.ReadObjects(repoRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range committed {
		if o.GetKind() == "Secret" {
			t.Errorf("the plain manifests carry Secret %s", o.GetName())
		}
		if o.GetKind() == "DaemonSet" {
			var ds appsv1.DaemonSet
			if err := fromUnstructured(o, &ds); err != nil {
				t.Fatal(err)
			}
			for _, a := range ds.Spec.Template.Spec.Containers[0].Args {
				if strings.HasPrefix(a, "--hubble-listen-address") || strings.HasPrefix(a, "--hubble-tls") {
					t.Errorf("the plain manifests' agent has %s", a)
				}
			}
		}
	}
}

// With hubble.serviceMap.enabled the operator serves the service map of
// the relay's flows: its flags name the relay's Service, it resolves that
// name from the host network, and the operator's own flag parsing and
// validation accept every argument the chart gives it.
func TestChartHubbleServiceMap(t *testing.T) {
	objs := renderObjects(t, "hubble.relay.enabled=true", "hubble.serviceMap.enabled=true")
	var dep appsv1.Deployment
	for _, o := range objs {
		if o.GetKind() == "Deployment" && o.GetName() == "cellium-operator" {
			if err := fromUnstructured(o, &dep); err != nil {
				t.Fatal(err)
			}
		}
	}
	if dep.Name == "" {
		t.Fatal("no cellium-operator Deployment")
	}
	if dep.Spec.Template.Spec.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
		t.Errorf("operator dnsPolicy %q, want ClusterFirstWithHostNet (it dials hubble-relay by name from the host network)", dep.Spec.Template.Spec.DNSPolicy)
	}
	args := dep.Spec.Template.Spec.Containers[0].Args
	for _, want := range []string{
		"--hubble-service-map-listen-address=localhost:12000",
		"--hubble-relay-address=hubble-relay.kube-system.svc.cluster.local.:80",
	} {
		if !slices.Contains(args, want) {
			t.Errorf("operator args %v lack %s", args, want)
		}
	}
	if err := hivetest.New(t, args, operator.Operator).Populate(); err != nil {
		t.Errorf("the operator refuses the chart's arguments %v: %v", args, err)
	}
	for _, o := range renderObjects(t, "hubble.relay.enabled=true") {
		if o.GetKind() == "Deployment" && o.GetName() == "cellium-operator" && strings.Contains(fmt.Sprint(o.Object), "hubble-service-map") {
			t.Error("the service map is on by default; Cilium's hubble-ui is off by default and so is cellium's map")
		}
	}
}
