package e2e

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"strconv"
	"testing"
	"time"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
)

// TestPrivilegedPodsEndToEnd is the pod/endpoint/CEP contract through the
// real path: 20 pods created through the devkubelet (netns, libcni,
// cellium-cni, the agent) get 20 ready CiliumEndpoints with the pods'
// names, IPs, node and identities; pods with the same security labels
// share an identity; each endpoint's .status from the agent API and from
// `cellium endpoint get -o json` equals its CEP's .status, which carries the
// computed policy (non-enforcing: no rule selects the pods); the veths are
// there. Deleting the pods removes CEPs, endpoints, IPs, veths and netns.
func TestPrivilegedPodsEndToEnd(t *testing.T) {
	e := newEnv(t, envOptions{})
	apps := []string{"web", "web", "web", "web", "db", "db", "cache", "cache", "queue", "queue"}
	want := map[string]map[string]string{}
	for i := range 20 {
		want[fmt.Sprintf("pod-%02d", i)] = map[string]string{"app": apps[i%len(apps)], "e2e": "pods"}
	}
	names := sortedKeys(want)
	e.createPods(want)
	pods := e.waitRunning(names, 60*time.Second)
	ceps := e.waitCEPs(pods, 30*time.Second)
	if n := len(ceps); n != 20 {
		t.Fatalf("%d CiliumEndpoints in %s, want 20 (one per pod, nothing else)", n, e.ns)
	}

	// Identities: one per label set, shared by its pods, distinct between
	// sets, carrying the pod's labels.
	byApp := map[string]int64{}
	for _, n := range names {
		id := ceps[n].Status.Identity
		app := want[n]["app"]
		if prev, ok := byApp[app]; ok && prev != id.ID {
			t.Errorf("pod %s (app=%s) has identity %d, its peers %d", n, app, id.ID, prev)
		}
		byApp[app] = id.ID
		found := false
		for _, l := range id.Labels {
			found = found || l == "k8s:app="+app
		}
		if !found {
			t.Errorf("identity %d of %s lacks k8s:app=%s: %v", id.ID, n, app, id.Labels)
		}
	}
	seen := map[int64]string{}
	for app, id := range byApp {
		if other, ok := seen[id]; ok {
			t.Errorf("apps %s and %s share identity %d", app, other, id)
		}
		seen[id] = app
		if _, err := e.cilium.CiliumV2().CiliumIdentities().Get(e.ctx, strconv.FormatInt(id, 10), metavOpts); err != nil {
			t.Errorf("CiliumIdentity %d of app=%s: %v", id, app, err)
		}
	}

	// The agent's view: one endpoint per pod whose .status is the CEP's;
	// the pod's IP allocated to it; its veth present with the endpoint's
	// ifindex.
	sbs := e.sandboxes()
	eventually(t, 20*time.Second, "agent endpoint .status == CEP .status", func() error {
		ceps, err := e.ceps()
		if err != nil {
			return err
		}
		for _, n := range names {
			cep := ceps[n]
			ep, err := e.agent.GetEndpoint(e.ctx, strconv.FormatInt(cep.Status.ID, 10))
			if err != nil {
				return fmt.Errorf("GET /v1/endpoint/%d (%s): %w", cep.Status.ID, n, err)
			}
			if ok, a, b := jsonEqual(ep.Status, cep.Status); !ok {
				return fmt.Errorf("pod %s: agent .status\n%s\n!= CEP .status\n%s", n, a, b)
			}
			// The policy engine's result is part of both: no rule
			// selects these pods, so neither direction enforces.
			if p := cep.Status.Policy; p == nil || p.Ingress == nil || p.Egress == nil ||
				p.Ingress.State != "non-enforcing" || p.Egress.State != "non-enforcing" {
				return fmt.Errorf("pod %s: CEP .status.policy %+v, want both directions non-enforcing", n, p)
			}
		}
		return nil
	})
	eps, err := e.endpoints()
	if err != nil {
		t.Fatal(err)
	}
	allocs, err := e.allocations()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		ep, ok := eps[n]
		if !ok {
			t.Errorf("no agent endpoint for %s", n)
			continue
		}
		if ep.ID != ceps[n].Status.ID {
			t.Errorf("pod %s: endpoint ID %d, CEP says %d", n, ep.ID, ceps[n].Status.ID)
		}
		if owner := allocs[pods[n].Status.PodIP]; owner != e.ns+"/"+n {
			t.Errorf("IP %s of %s allocated to %q", pods[n].Status.PodIP, n, owner)
		}
		if idx, ok := linkExists(ep.Spec.InterfaceName); !ok || idx != ep.Spec.InterfaceIndex {
			t.Errorf("pod %s: host veth %s ifindex %d exists=%v, endpoint says %d", n, ep.Spec.InterfaceName, idx, ok, ep.Spec.InterfaceIndex)
		}
		if sb := sbs[n]; sb.IP != pods[n].Status.PodIP || sb.ID != ep.Spec.ContainerID {
			t.Errorf("pod %s: sandbox %s/%s, endpoint container %s IP %s", n, sb.ID, sb.IP, ep.Spec.ContainerID, pods[n].Status.PodIP)
		}
	}

	// The CLI prints the same .status.
	t.Run("cli", func(t *testing.T) {
		cli := cliBinary(t)
		for _, n := range names[:3] {
			cep := ceps[n]
			out, err := exec.CommandContext(e.ctx, cli, "-H", "unix://"+e.node.AgentConfig().SocketPath(),
				"endpoint", "get", strconv.FormatInt(cep.Status.ID, 10), "-o", "json").Output()
			if err != nil {
				t.Fatalf("cellium endpoint get %d: %v", cep.Status.ID, err)
			}
			var got struct {
				Status ciliumv2.EndpointStatus `json:"status"`
			}
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatalf("cellium endpoint get -o json: %v\n%s", err, out)
			}
			fresh, err := e.cilium.CiliumV2().CiliumEndpoints(e.ns).Get(e.ctx, n, metavOpts)
			if err != nil {
				t.Fatal(err)
			}
			if ok, a, b := jsonEqual(got.Status, fresh.Status); !ok {
				t.Errorf("pod %s: `cellium endpoint get -o json` .status\n%s\n!= CEP .status\n%s", n, a, b)
			}
		}
	})

	// Deleting the pods (gracefully: the kubelet tears down, then
	// confirms) leaves nothing.
	e.deletePods(names, nil)
	e.waitGone(names, sbs, 60*time.Second)
}
