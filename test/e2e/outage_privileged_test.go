package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	cnitypes "github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
)

// TestPrivilegedAPIServerOutage stops the real kube-apiserver (etcd and
// certificates stay) under a running agent with pods, then restarts the
// agent while it is still down, then brings it back:
//   - while running: CNI DEL through the real plugin frees the endpoint and
//     IP; ADD of a pod the agent has listed, whose labels' identity is in
//     use, succeeds; ADD of a pod it has never seen fails with code 11;
//   - agent restarted without the API: its socket and CNI configuration
//     are back within seconds, the restored endpoints are ready with their
//     saved identities, DEL frees, an ADD fails fast with code 11 and a
//     message;
//   - API back after 60 s: the CiliumEndpoints converge (the deleted endpoints' CEPs
//     are removed, the one added during the outage is created).
func TestPrivilegedAPIServerOutage(t *testing.T) {
	const outageFor = 60 * time.Second
	e := newEnv(t, envOptions{})
	names := []string{"out-0", "out-1", "out-2"}
	spec := map[string]map[string]string{}
	for _, n := range names {
		spec[n] = map[string]string{"app": "outage"}
	}
	e.createPods(spec)
	pods := e.waitRunning(names, 60*time.Second)
	e.waitCEPs(pods, 30*time.Second)
	sbs := e.sandboxes()

	// A pod the kubelet does not start: this test runs its ADD during
	// the outage. Wait until the agent has it in its pods table.
	if err := e.node.StopKubelet(); err != nil {
		t.Fatal(err)
	}
	late := e.createPods(map[string]map[string]string{"late": {"app": "outage"}})["late"]
	eventually(t, 30*time.Second, "the agent to list pod late", func() error {
		raw, err := e.agent.GetStatedbTable(e.ctx, "k8s-pods")
		if err != nil {
			return err
		}
		if !strings.Contains(string(raw), string(late.UID)) {
			return fmt.Errorf("pod late (UID %s) not in the agent's pods table", late.UID)
		}
		return nil
	})

	if err := e.c.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	restarted := false
	t.Cleanup(func() {
		if !restarted {
			_ = e.c.StartAPIServer(t.Context())
		}
	})
	outage := time.Now()
	conf := e.netconf(nil)

	// DEL of a running pod frees its endpoint and IP.
	sb := sbs["out-0"]
	if _, code := e.runPlugin(pluginCall{command: "DEL", containerID: sb.ID, netns: sb.NetnsPath, args: e.podArgs("out-0", sb.ID), stdin: conf}); code != 0 {
		t.Fatalf("DEL during the outage: code %d", code)
	}
	if err := e.leftovers(sb.ID, "out-0", nil, true); err != nil {
		t.Errorf("DEL during the outage left: %v", err)
	}

	// ADD of a listed pod whose identity is in use works.
	lateNS := newNetns(t)
	lateID := containerID()
	began := time.Now()
	out, code := e.runPlugin(pluginCall{command: "ADD", containerID: lateID, netns: lateNS.Path(), args: e.podArgs("late", lateID), stdin: conf})
	if code != 0 {
		t.Fatalf("ADD of a listed pod with a known identity during the outage: code %d %s", code, out)
	}
	t.Logf("ADD during the outage took %v", time.Since(began))
	var res types100.Result
	if err := json.Unmarshal(out, &res); err != nil || len(res.IPs) == 0 {
		t.Fatalf("ADD result %s: %v", out, err)
	}
	lateIP := res.IPs[0].Address.IP.String()

	// ADD of a pod the agent never saw needs the API: code 11.
	ghostNS := newNetns(t)
	ghostID := containerID()
	began = time.Now()
	out, code = e.runPlugin(pluginCall{command: "ADD", containerID: ghostID, netns: ghostNS.Path(), args: e.podArgs("ghost", ghostID), stdin: conf})
	if code != 11 {
		t.Errorf("ADD of an unknown pod during the outage: code %d %s, want 11", code, out)
	}
	t.Logf("ADD of an unknown pod failed in %v", time.Since(began))
	if err := e.leftovers(ghostID, "ghost", ghostNS, true); err != nil {
		t.Errorf("failed ADD left: %v", err)
	}

	// Restart the agent while the API server is still down.
	if err := e.node.StopAgent(); err != nil {
		t.Fatal(err)
	}
	began = time.Now()
	// Bounded: an agent that waits for the API server never writes its
	// CNI configuration, which StartAgent waits for.
	startCtx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	err := e.node.StartAgent(startCtx)
	cancel()
	if err != nil {
		t.Fatalf("agent start without the API server: %v", err)
	}
	t.Logf("agent serving with its CNI configuration %v after start without the API server", time.Since(began))
	eventually(t, 10*time.Second, "restored endpoints ready", func() error {
		eps, err := e.endpoints()
		if err != nil {
			return err
		}
		for _, n := range []string{"out-1", "out-2", "late"} {
			if ep, ok := eps[n]; !ok || ep.Status.State != "ready" {
				return fmt.Errorf("endpoint of %s not ready: %+v", n, ep.Status.State)
			}
		}
		return nil
	})
	sb = sbs["out-1"]
	if _, code := e.runPlugin(pluginCall{command: "DEL", containerID: sb.ID, netns: sb.NetnsPath, args: e.podArgs("out-1", sb.ID), stdin: conf}); code != 0 {
		t.Fatalf("DEL after a restart without the API server: code %d", code)
	}
	if err := e.leftovers(sb.ID, "out-1", nil, true); err != nil {
		t.Errorf("DEL after a restart without the API server left: %v", err)
	}
	began = time.Now()
	out, code = e.runPlugin(pluginCall{command: "ADD", containerID: ghostID, netns: ghostNS.Path(), args: e.podArgs("ghost", ghostID), stdin: conf})
	var cniErr cnitypes.Error
	_ = json.Unmarshal(out, &cniErr)
	if code != 11 || !strings.Contains(cniErr.Msg+cniErr.Details, "API server") {
		t.Errorf("ADD after a restart without the API server: code %d %s, want 11 saying why", code, out)
	}
	t.Logf("ADD after a restart without the API server failed in %v: %s", time.Since(began), cniErr.Msg)
	if err := e.leftovers(ghostID, "ghost", ghostNS, true); err != nil {
		t.Errorf("failed ADD left: %v", err)
	}

	// Hold the outage as long as the (the reflectors' backoff
	// grows meanwhile), then bring the API server back.
	select {
	case <-time.After(time.Until(outage.Add(outageFor))):
	case <-e.ctx.Done():
		t.Fatal(e.ctx.Err())
	}
	if err := e.c.StartAPIServer(e.ctx); err != nil {
		t.Fatal(err)
	}
	restarted = true
	back := time.Now()
	t.Logf("API server down for %v", back.Sub(outage).Round(time.Second))
	eventually(t, 90*time.Second, "CiliumEndpoints to converge", func() error {
		ceps, err := e.ceps()
		if err != nil {
			return err
		}
		for _, n := range []string{"out-0", "out-1"} {
			if ceps[n] != nil {
				return fmt.Errorf("CEP of %s, deleted during the outage, still there", n)
			}
		}
		if err := e.checkCEP(ceps["out-2"], pods["out-2"]); err != nil {
			return err
		}
		c := ceps["late"]
		if c == nil || c.Status.Networking == nil || len(c.Status.Networking.Addressing) == 0 ||
			c.Status.Networking.Addressing[0].IPV4 != lateIP || c.Status.State != "ready" {
			return fmt.Errorf("CEP of late (IP %s): %+v", lateIP, c)
		}
		return nil
	})

	t.Logf("CiliumEndpoints converged %v after the API server was back", time.Since(back).Round(100*time.Millisecond))

	// The pod added by hand goes with a DEL; the kubelet's are the node's.
	if _, code := e.runPlugin(pluginCall{command: "DEL", containerID: lateID, netns: lateNS.Path(), args: e.podArgs("late", lateID), stdin: conf}); code != 0 {
		t.Errorf("DEL of late: code %d", code)
	}
	zero := int64(0)
	e.deletePods([]string{"out-0", "out-1", "late"}, &zero)
}
