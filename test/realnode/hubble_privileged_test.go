package realnode

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	observerpb "github.com/cilium/cilium/api/v1/observer"
	"google.golang.org/protobuf/encoding/protojson"
	_ "google.golang.org/protobuf/types/known/structpb" // the flows' extensions (source_node, destination_node)
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/cellium/cellium/cells/servicemap"
	"github.com/cellium/cellium/install"
	"github.com/cellium/cellium/test/harness"
	"github.com/cellium/cellium/test/privileged"
)

// hubblePolicy is the NetworkPolicy of TestPrivilegedRealClusterHubble: db
// accepts web on TCP 9090 only, so web's connections to db's 8080 are
// policy drops that name it.
const hubblePolicy = "db-allow-web-9090"

// TestPrivilegedRealClusterHubble is issue 16's "done when" on a cluster of
// two real nodes installed as make up does (hubble-relay from the chart,
// the agents' Hubble API on :4244 with the chart's certificates): a user
// port-forwards to the hubble-relay Service and runs the upstream hubble
// CLI against it.
//
//   - hubble list nodes shows both nodes Connected;
//   - hubble observe --pod demo/web-1 --follow, started (twice: JSON and
//     the default compact output) before any traffic, shows, while kubectl
//     exec traffic runs from web-1 (node 1) to web-2 and db-1 (node 2):
//     web-1 -> web-2 FORWARDED with both pod names, flows captured by both
//     nodes, and web-1 -> db-1:8080 DROPPED with POLICY_DENIED ("Policy
//     denied" in the compact output) and the NetworkPolicy that denies it
//     in ingress_denied_by; only flows of demo/web-1;
//   - observe --verdict DROPPED, --namespace demo, --last 20 through the
//     relay answer with exactly what they ask for;
//   - kubectl exec ds/cellium-agent -c cellium-agent -- hubble ... (the CLI
//     in the agent's image, HUBBLE_SERVER set by the chart) reads the
//     node's own socket.
func TestPrivilegedRealClusterHubble(t *testing.T) {
	privileged.Require(t)
	bins := nodeBinaries(t)
	hubble := hubbleCLI(t)
	kubectlBin := kubectlCommand(t)
	ctx := t.Context()
	logger := slog.New(slog.NewTextHandler(t.Output(), nil))
	dir, err := os.MkdirTemp("", "crh-")
	if err != nil {
		t.Fatal(err)
	}
	var c *Cluster
	t.Cleanup(func() {
		if c != nil {
			if t.Failed() {
				dumpNodes(t, c)
			}
			if err := c.Stop(context.Background()); err != nil {
				t.Errorf("stop: %v", err)
			}
			if left := ClusterLeftovers(dir); len(left) > 0 {
				t.Errorf("Stop left on the host:\n  %s", strings.Join(left, "\n  "))
			}
		} else if err := Down(context.Background(), dir, logger); err != nil {
			t.Errorf("down: %v", err)
		}
		if t.Failed() {
			t.Logf("cluster logs kept in %s", dir)
			return
		}
		_ = os.RemoveAll(dir)
	})
	began := time.Now()
	c, err = Up(ctx, ClusterOptions{Dir: dir, Nodes: 2, NodeBinaries: bins, HubbleRelay: true, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Up with 2 nodes and hubble-relay took %s", time.Since(began).Round(time.Second))
	cs := c.Control.Clientset()
	node1, node2 := c.Nodes[0].Name, c.Nodes[1].Name
	kubectl := func(ctx context.Context, args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, kubectlBin, append([]string{"--kubeconfig", c.Kubeconfig()}, args...)...)
		// Only stdout is parsed: kubectl's own warnings (its websocket
		// client logs "Unknown stream id" to stderr) are not hubble's
		// output and go into the error when the command fails.
		var out, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &stderr
		if err := cmd.Run(); err != nil {
			return out.String(), fmt.Errorf("%w: %s", err, stderr.String())
		}
		return out.String(), nil
	}

	// The demo pods: web-1 on node 1, web-2 and db-1 on node 2.
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: DemoNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pods := []struct{ name, app, node string }{{"web-1", "web", node1}, {"web-2", "web", node2}, {"db-1", "db", node2}}
	for _, p := range pods {
		_, err := cs.CoreV1().Pods(DemoNamespace).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: p.name, Labels: map[string]string{"app": p.app}},
			Spec: corev1.PodSpec{
				NodeName:                     p.node,
				AutomountServiceAccountToken: new(bool),
				Containers:                   []corev1.Container{{Name: "app", Image: DemoImage, ImagePullPolicy: corev1.PullNever}},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
	ips := map[string]string{}
	for _, p := range pods {
		eventually(t, 2*time.Minute, "pod "+p.name+" Ready", func() error {
			pod, err := cs.CoreV1().Pods(DemoNamespace).Get(ctx, p.name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if !podReady(pod) || pod.Status.PodIP == "" {
				return fmt.Errorf("phase %s, IP %q", pod.Status.Phase, pod.Status.PodIP)
			}
			ips[p.name] = pod.Status.PodIP
			return nil
		})
	}
	get := func(from, to string) (string, error) {
		return kubectl(ctx, "-n", DemoNamespace, "exec", from, "--", "demoapp", "--get", "http://"+ips[to]+":8080/")
	}
	eventually(t, time.Minute, "web-1 reaching web-2 and db-1 (kubectl exec)", func() error {
		for _, to := range []string{"web-2", "db-1"} {
			if out, err := get("web-1", to); err != nil || !strings.Contains(out, "hello from "+to) {
				return fmt.Errorf("to %s: %v: %s", to, err, out)
			}
		}
		return nil
	})

	// The way in: kubectl port-forward to the relay's Service, on a free
	// port of the loopback.
	relayAddr := portForward(t, kubectlBin, c.Kubeconfig(), "svc/"+RelayService, "80")
	hubbleRun := func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, hubble, append(args, "--server", relayAddr)...)
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		if err != nil {
			return out.String() + errOut.String(), err
		}
		return out.String(), nil
	}

	// hubble list nodes: both nodes, Connected.
	var nodesOut string
	eventually(t, time.Minute, "hubble list nodes showing both nodes Connected", func() error {
		out, err := hubbleRun("list", "nodes")
		nodesOut = out
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		connected := map[string]bool{}
		for _, line := range strings.Split(out, "\n")[1:] {
			if f := strings.Fields(line); len(f) >= 2 && f[1] == "Connected" {
				connected[f[0]] = true
			}
		}
		if !connected[node1] || !connected[node2] || len(connected) != 2 {
			return fmt.Errorf("connected %v, want %s and %s:\n%s", connected, node1, node2, out)
		}
		return nil
	})
	t.Logf("hubble list nodes:\n%s", nodesOut)

	// Followers started before the traffic: JSON (to assert fields) and the
	// compact text users read.
	followed := time.Now()
	jsonLines := follow(t, hubble, relayAddr, "-o", "json")
	textLines := follow(t, hubble, relayAddr)

	// db accepts web on 9090 only: web's connections to 8080 are dropped.
	port9090 := intstr.FromInt32(9090)
	_, err = cs.NetworkingV1().NetworkPolicies(DemoNamespace).Create(ctx, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: hubblePolicy},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: &port9090}},
			}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	// Traffic by kubectl exec until the followers have shown what a user
	// looks for, checking every followed flow as it comes.
	var (
		forwarded, dropped     *flowpb.Flow
		forwardedBy            = map[string]bool{}
		textForward, textDrop  string
		deniedAfterPolicy      bool
		flowsSeen, textLineCnt int
		textSample             []string
	)
	isPod := func(e *flowpb.Endpoint, name string) bool {
		return e.GetNamespace() == DemoNamespace && e.GetPodName() == name
	}
	deadline := time.Now().Add(2 * time.Minute)
	for forwarded == nil || dropped == nil || len(forwardedBy) < 2 || textForward == "" || textDrop == "" {
		if time.Now().After(deadline) {
			t.Fatalf("after 2 minutes of traffic: forwarded web-1 -> web-2 %v (captured by %v), policy drop web-1 -> db-1 %v, compact lines %q / %q; %d flows followed",
				forwarded != nil, forwardedBy, dropped != nil, textForward, textDrop, flowsSeen)
		}
		if out, err := get("web-1", "web-2"); err != nil {
			t.Fatalf("web-1 -> web-2 (no policy selects web-2): %v: %s", err, out)
		}
		if _, err := get("web-1", "db-1"); err != nil {
			deniedAfterPolicy = true
		}
		drain := time.After(time.Second)
	read:
		for {
			select {
			case line := <-jsonLines:
				f := jsonFlow(t, line)
				if f == nil {
					continue
				}
				flowsSeen++
				if !isPod(f.GetSource(), "web-1") && !isPod(f.GetDestination(), "web-1") {
					t.Errorf("--pod demo/web-1 followed a flow of neither end web-1: %s", line)
				}
				if f.GetTime().AsTime().Before(followed) {
					continue // from before the followers started
				}
				switch {
				case f.GetVerdict() == flowpb.Verdict_FORWARDED && isPod(f.GetSource(), "web-1") && isPod(f.GetDestination(), "web-2"):
					forwarded = f
					forwardedBy[f.GetNodeName()] = true
				case f.GetVerdict() == flowpb.Verdict_DROPPED && isPod(f.GetSource(), "web-1") && isPod(f.GetDestination(), "db-1"):
					if f.GetDropReasonDesc() != flowpb.DropReason_POLICY_DENIED {
						t.Errorf("web-1 -> db-1 dropped for %s, want POLICY_DENIED: %s", f.GetDropReasonDesc(), line)
					}
					if !slices.ContainsFunc(f.GetIngressDeniedBy(), func(p *flowpb.Policy) bool {
						return p.GetName() == hubblePolicy && p.GetNamespace() == DemoNamespace && p.GetKind() == "NetworkPolicy"
					}) {
						t.Errorf("the policy drop does not name NetworkPolicy %s/%s in ingress_denied_by: %s", DemoNamespace, hubblePolicy, line)
					}
					if f.GetNodeName() != node2 || f.GetL4().GetTCP().GetDestinationPort() != 8080 {
						t.Errorf("the policy drop was captured by %s for port %d, want db-1's node %s, port 8080: %s",
							f.GetNodeName(), f.GetL4().GetTCP().GetDestinationPort(), node2, line)
					}
					dropped = f
				}
			case line := <-textLines:
				textLineCnt++
				if len(textSample) < 12 {
					textSample = append(textSample, line)
				}
				switch {
				case strings.Contains(line, "demo/web-1") && strings.Contains(line, "demo/web-2") && strings.Contains(line, "FORWARDED"):
					textForward = line
				case strings.Contains(line, "demo/web-1") && strings.Contains(line, "demo/db-1") && strings.Contains(line, "Policy denied") && strings.Contains(line, "DROPPED"):
					textDrop = line
				}
			case <-drain:
				break read
			}
		}
	}
	if !deniedAfterPolicy {
		t.Error("web-1 reached db-1:8080 every time under the policy")
	}
	if !forwardedBy[node1] || !forwardedBy[node2] {
		t.Errorf("forwarded web-1 -> web-2 flows captured by %v, want both %s and %s (the relay merges the nodes)", forwardedBy, node1, node2)
	}
	if t.Failed() {
		t.FailNow()
	}
	t.Logf("followed %d JSON flows and %d compact lines; the first compact lines:\n  %s\nmatched:\n  %s\n  %s",
		flowsSeen, textLineCnt, strings.Join(textSample, "\n  "), textForward, textDrop)
	pj := protojson.MarshalOptions{UseProtoNames: true}
	t.Logf("the policy drop (-o json): %s", pj.Format(dropped))

	// More flows on both nodes for the queries below (each node's ring
	// then holds more than 20 of namespace demo).
	for range 5 {
		if out, err := get("web-1", "web-2"); err != nil {
			t.Fatalf("web-1 -> web-2: %v: %s", err, out)
		}
	}

	// One-shot queries through the relay.
	flowsOf := func(args ...string) []*observerpb.GetFlowsResponse {
		t.Helper()
		out, err := hubbleRun(append([]string{"observe", "-o", "json"}, args...)...)
		if err != nil {
			t.Fatalf("hubble observe %v: %v\n%s", args, err, out)
		}
		var rs []*observerpb.GetFlowsResponse
		for line := range strings.Lines(out) {
			var r observerpb.GetFlowsResponse
			if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal([]byte(line), &r); err != nil {
				t.Fatalf("hubble observe %v printed a line that is not a GetFlowsResponse: %v\n%s", args, err, line)
			}
			if r.GetFlow() != nil {
				rs = append(rs, &r)
			}
		}
		return rs
	}
	drops := flowsOf("--verdict", "DROPPED", "--last", "1000")
	if len(drops) == 0 {
		t.Error("observe --verdict DROPPED: no flow")
	}
	policyDrop := false
	for _, r := range drops {
		f := r.GetFlow()
		if f.GetVerdict() != flowpb.Verdict_DROPPED {
			t.Errorf("observe --verdict DROPPED gave a %s flow", f.GetVerdict())
		}
		policyDrop = policyDrop || (isPod(f.GetSource(), "web-1") && isPod(f.GetDestination(), "db-1") && f.GetDropReasonDesc() == flowpb.DropReason_POLICY_DENIED)
	}
	if !policyDrop {
		t.Errorf("observe --verdict DROPPED: no policy drop web-1 -> db-1 among %d drops", len(drops))
	}
	inDemo := flowsOf("--namespace", DemoNamespace, "--last", "20")
	perNode := map[string]int{}
	for _, r := range inDemo {
		f := r.GetFlow()
		if f.GetSource().GetNamespace() != DemoNamespace && f.GetDestination().GetNamespace() != DemoNamespace {
			t.Errorf("observe --namespace demo gave a flow of %s/%s -> %s/%s", f.GetSource().GetNamespace(), f.GetSource().GetPodName(),
				f.GetDestination().GetNamespace(), f.GetDestination().GetPodName())
		}
		perNode[f.GetNodeName()]++
	}
	// The relay asks every node for its last 20 (Hubble's relay does not
	// cut the merged stream).
	if perNode[node1] != 20 || perNode[node2] != 20 || len(perNode) != 2 {
		t.Errorf("observe --namespace demo --last 20: flows per node %v, want 20 from each of %s and %s", perNode, node1, node2)
	}

	// The CLI inside the agent's container, as in Cilium (kubectl exec
	// ds/cilium -- hubble observe): HUBBLE_SERVER is the node's socket.
	out, err := kubectl(ctx, "-n", install.Namespace, "exec", "ds/"+AgentDaemonSet, "-c", "cellium-agent", "--", "hubble", "status")
	if err != nil || !strings.Contains(out, "/var/run/cellium/hubble.sock): Ok") {
		t.Errorf("kubectl exec ds/%s -- hubble status: %v\n%s", AgentDaemonSet, err, out)
	}
	t.Logf("kubectl exec ds/%s -c cellium-agent -- hubble status:\n%s", AgentDaemonSet, out)
	agent2 := agentPodOn(t, c, node2)
	out, err = kubectl(ctx, "-n", install.Namespace, "exec", agent2, "-c", "cellium-agent", "--",
		"hubble", "observe", "--pod", DemoNamespace+"/web-1", "--verdict", "DROPPED", "--last", "100", "-o", "json")
	if err != nil {
		t.Fatalf("kubectl exec %s -- hubble observe: %v\n%s", agent2, err, out)
	}
	execDrop := false
	for line := range strings.Lines(out) {
		f := jsonFlow(t, line)
		if f == nil {
			continue
		}
		if f.GetNodeName() != node2 {
			t.Errorf("the agent of %s served a flow of node %s: %s", node2, f.GetNodeName(), line)
		}
		execDrop = execDrop || (isPod(f.GetDestination(), "db-1") && f.GetDropReasonDesc() == flowpb.DropReason_POLICY_DENIED)
	}
	if !execDrop {
		t.Errorf("hubble observe in %s's agent: no policy drop web-1 -> db-1:\n%s", node2, out)
	}
	t.Logf("in the agent's container of %s: hubble observe --pod demo/web-1 --verdict DROPPED found the policy drop", node2)

	// Hubble's own stream to the relay must not fill the ring: its packets
	// cross the tunnel, and tracing each of them made a flow that the
	// stream carried again (the chart's monitorFlags=all at to-overlay).
	for _, node := range []string{node1, node2} {
		agent := agentPodOn(t, c, node)
		out, err := kubectl(ctx, "-n", install.Namespace, "exec", agent, "-c", "cellium-agent", "--", "hubble", "observe", "--last", "1000", "-o", "json")
		if err != nil {
			t.Fatalf("kubectl exec %s -- hubble observe --last 1000: %v", agent, err)
		}
		total, relay := 0, 0
		for line := range strings.Lines(out) {
			f := jsonFlow(t, line)
			if f == nil {
				continue
			}
			total++
			if strings.HasPrefix(f.GetSource().GetPodName(), RelayService) || strings.HasPrefix(f.GetDestination().GetPodName(), RelayService) {
				relay++
			}
		}
		if relay*2 > total {
			t.Errorf("%d of the last %d flows of %s are hubble-relay's own traffic: Hubble's stream feeds on its traces", relay, total, node)
		}
		t.Logf("%s: %d of the last %d flows are hubble-relay's own traffic", node, relay, total)
	}

	// The service map the operator draws from the relay's flows
	// (hubble.serviceMap.enabled), reached as make up says: a
	// port-forward to the operator. The denied web-1 -> db-1:8080 is a
	// dropped edge naming the NetworkPolicy, web-1 -> web-2 a forwarded one.
	mapAddr := portForward(t, kubectlBin, c.Kubeconfig(), "deploy/"+OperatorDeployment, "12000")
	eventually(t, 90*time.Second, "the service map's dropped edge web-1 -> db-1 naming the policy", func() error {
		if _, err := get("web-1", "db-1"); err == nil {
			return fmt.Errorf("web-1 reached db-1:8080 under the policy")
		}
		resp, err := http.Get("http://" + mapAddr + "/api/graph")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var snap servicemap.Snapshot
		if err := json.NewDecoder(resp.Body).Decode(&snap); err != nil {
			return fmt.Errorf("GET /api/graph: %s: %w", resp.Status, err)
		}
		if snap.Upstream.State != "connected" {
			return fmt.Errorf("the map's upstream %s is %s: %s", snap.Upstream.Address, snap.Upstream.State, snap.Upstream.Error)
		}
		var denied, forwarded bool
		for _, e := range snap.Edges {
			switch {
			case e.Source == DemoNamespace+"/web-1" && e.Destination == DemoNamespace+"/db-1" && e.Port == 8080:
				denied = e.State == "dropped" && e.Dropped > 0 && slices.Contains(e.DeniedBy, "NetworkPolicy "+DemoNamespace+"/"+hubblePolicy)
				if !denied {
					return fmt.Errorf("edge %s: state %s, %d dropped, denied by %v; want dropped by NetworkPolicy %s/%s", e.ID, e.State, e.Dropped, e.DeniedBy, DemoNamespace, hubblePolicy)
				}
			case e.Source == DemoNamespace+"/web-1" && e.Destination == DemoNamespace+"/web-2" && e.Port == 8080:
				forwarded = e.Forwarded > 0
			}
		}
		if !denied || !forwarded {
			return fmt.Errorf("edges web-1 -> db-1 dropped %t, web-1 -> web-2 forwarded %t among %d edges", denied, forwarded, len(snap.Edges))
		}
		t.Logf("the service map (GET /api/graph through port-forward deploy/%s): %d nodes, %d edges, upstream %s with %d nodes; web-1 -> db-1:8080 dropped, denied by NetworkPolicy %s/%s",
			OperatorDeployment, len(snap.Nodes), len(snap.Edges), snap.Upstream.Address, snap.Upstream.ConnectedNodes, DemoNamespace, hubblePolicy)
		return nil
	})
}

// jsonFlow decodes one line of `hubble observe -o json` and returns its
// flow (nil for node status and other events).
func jsonFlow(t *testing.T, line string) *flowpb.Flow {
	t.Helper()
	if strings.TrimSpace(line) == "" {
		return nil
	}
	var r observerpb.GetFlowsResponse
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal([]byte(line), &r); err != nil {
		t.Fatalf("hubble printed a line that is not a GetFlowsResponse: %v\n%s", err, line)
	}
	return r.GetFlow()
}

// follow starts `hubble observe --pod demo/web-1 --follow` (with more
// args) against server and returns its output lines; the process ends
// with the test.
func follow(t *testing.T, hubble, server string, args ...string) <-chan string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, hubble, append([]string{"observe", "--pod", DemoNamespace + "/web-1", "--follow", "--server", server}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 4096)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-ctx.Done():
				return
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("hubble observe --follow %v stderr:\n%s", args, stderr.String())
		}
	})
	return lines
}

// portForward runs `kubectl port-forward target :port` (a free local port
// on 127.0.0.1) for the rest of the test and returns the local address.
func portForward(t *testing.T, kubectl, kubeconfig, target, port string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, kubectl, "--kubeconfig", kubeconfig, "-n", install.Namespace,
		"port-forward", "--address", "127.0.0.1", target, ":"+port)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() {
		cancel()
		<-done
		_ = cmd.Wait()
	})
	addr := make(chan string, 1)
	go func() {
		defer close(done)
		re := regexp.MustCompile(`Forwarding from (127\.0\.0\.1:\d+) ->`)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case addr <- m[1]:
				default:
				}
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case a := <-addr:
		return a
	case <-time.After(30 * time.Second):
		t.Fatalf("kubectl port-forward %s did not start in 30s: %s", target, stderr.String())
	}
	return ""
}

// agentPodOn returns the name of the agent's pod on node.
func agentPodOn(t *testing.T, c *Cluster, node string) string {
	t.Helper()
	pods, err := c.Control.Clientset().CoreV1().Pods(install.Namespace).List(t.Context(), metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/component=agent", FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 1 {
		t.Fatalf("%d agent pods on node %s", len(pods.Items), node)
	}
	return pods.Items[0].Name
}

// hubbleCLI returns the cached upstream hubble CLI, building it when
// CELLIUM_REAL_NODE=1 asks for what is missing (as nodeBinaries does).
func hubbleCLI(t *testing.T) string {
	t.Helper()
	if b, ok := harness.CachedHubble(); ok {
		return b.Hubble
	}
	if os.Getenv(realNodeEnv) != "1" {
		t.Skip("the upstream hubble CLI and hubble-relay are not built yet: run `make hubble-binaries` (~10 minutes once)")
	}
	b, err := harness.EnsureHubble(t.Context(), slog.New(slog.NewTextHandler(t.Output(), nil)))
	if err != nil {
		t.Fatal(err)
	}
	return b.Hubble
}

// kubectlCommand returns kubectl: the one on $PATH, else the cluster's
// version from the cache (built when missing).
func kubectlCommand(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("kubectl"); err == nil {
		return p
	}
	if p, ok := harness.CachedKubectl(); ok {
		return p
	}
	p, err := harness.EnsureKubectl(t.Context(), slog.New(slog.NewTextHandler(t.Output(), nil)))
	if err != nil {
		t.Fatal(err)
	}
	return p
}
