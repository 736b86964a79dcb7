package e2e

import (
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/v1/models"
)

// handCEP is a CiliumEndpoint made by hand: no agent wrote it.
func (e *env) handCEP(name, nodeIP string, owner types.UID) *ciliumv2.CiliumEndpoint {
	e.t.Helper()
	cep := &ciliumv2.CiliumEndpoint{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
		Status: ciliumv2.EndpointStatus{
			ID:    4242,
			State: ciliumv2.EndpointStateReady,
			Networking: &ciliumv2.EndpointNetworking{
				Addressing: ciliumv2.AddressPairList{{IPV4: "10.255.255.254"}},
				NodeIP:     nodeIP,
			},
			Identity: &ciliumv2.EndpointIdentity{ID: 4242},
		},
	}
	if owner != "" {
		cep.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: name, UID: owner}}
	}
	created, err := e.cilium.CiliumV2().CiliumEndpoints(e.ns).Create(e.ctx, cep, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("create CEP %s by hand: %v", name, err)
	}
	return created
}

// TestPrivilegedAgentRestart: the agent stops; meanwhile pods are deleted
// for good (the kubelet is down too, so nobody runs CNI DEL) and a stale
// CEP of this node and a CEP of another node are made by hand. After the
// restart the surviving pods' endpoints are restored with their IDs, IPs
// and interfaces (same ifindex) and their CEPs are kept; the stale CEP is
// deleted, the other node's CEP is not; the deleted pods leave nothing
// behind once the kubelet is back. Then a CEP whose owner is another pod
// UID is not overwritten by the agent for a new pod of that name until it
// is deleted.
func TestPrivilegedAgentRestart(t *testing.T) {
	e := newEnv(t, envOptions{})
	keep := []string{"keep-0", "keep-1", "keep-2", "keep-3"}
	gone := []string{"gone-0", "gone-1", "gone-2"}
	spec := map[string]map[string]string{}
	for _, n := range keep {
		spec[n] = map[string]string{"app": "keep"}
	}
	for _, n := range gone {
		spec[n] = map[string]string{"app": "gone"}
	}
	names := append(append([]string(nil), keep...), gone...)
	e.createPods(spec)
	pods := e.waitRunning(names, 60*time.Second)
	before := e.waitCEPs(pods, 30*time.Second)
	epsBefore, err := e.endpoints()
	if err != nil {
		t.Fatal(err)
	}
	sbs := e.sandboxes()

	if err := e.node.StopKubelet(); err != nil {
		t.Fatal(err)
	}
	if err := e.node.StopAgent(); err != nil {
		t.Fatal(err)
	}
	zero := int64(0)
	e.deletePods(gone, &zero)
	e.handCEP("stale", e.node.IP.String(), "")
	other := e.handCEP("other-node", "127.255.0.9", "")

	if err := e.node.StartAgent(e.ctx); err != nil {
		t.Fatal(err)
	}

	// Restored: same ID, IP, interface and ifindex; ready; CEP kept (same
	// object) and ready.
	eventually(t, 30*time.Second, "restored endpoints ready", func() error {
		eps, err := e.endpoints()
		if err != nil {
			return err
		}
		for _, n := range keep {
			ep, ok := eps[n]
			if !ok {
				return fmt.Errorf("endpoint of %s not restored", n)
			}
			if ep.Status.State != models.EndpointStateReady {
				return fmt.Errorf("endpoint of %s is %s", n, ep.Status.State)
			}
		}
		return nil
	})
	eps, err := e.endpoints()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range keep {
		was, now := epsBefore[n], eps[n]
		if now.ID != was.ID || now.Spec.Addressing.IPV4 != was.Spec.Addressing.IPV4 ||
			now.Spec.InterfaceName != was.Spec.InterfaceName || now.Spec.InterfaceIndex != was.Spec.InterfaceIndex ||
			now.Spec.ContainerID != was.Spec.ContainerID {
			t.Errorf("pod %s: endpoint before restart %+v, after %+v", n, was.Spec, now.Spec)
		}
		if idx, ok := linkExists(was.Spec.InterfaceName); !ok || idx != was.Spec.InterfaceIndex {
			t.Errorf("pod %s: veth %s ifindex %d (exists %v), was %d: the interface was recreated", n, was.Spec.InterfaceName, idx, ok, was.Spec.InterfaceIndex)
		}
	}
	allocs, err := e.allocations()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range keep {
		if owner := allocs[pods[n].Status.PodIP]; owner != e.ns+"/"+n {
			t.Errorf("IP %s of %s after restart: allocated to %q", pods[n].Status.PodIP, n, owner)
		}
	}
	eventually(t, 30*time.Second, "stale CEP deleted, kept CEPs ready", func() error {
		ceps, err := e.ceps()
		if err != nil {
			return err
		}
		if ceps["stale"] != nil {
			return fmt.Errorf("stale CEP of this node still there")
		}
		for _, n := range keep {
			if err := e.checkCEP(ceps[n], pods[n]); err != nil {
				return err
			}
		}
		return nil
	})
	ceps, err := e.ceps()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range keep {
		if ceps[n].UID != before[n].UID || ceps[n].Status.ID != before[n].Status.ID {
			t.Errorf("CEP %s replaced across the restart: UID %s -> %s, ID %d -> %d", n, before[n].UID, ceps[n].UID, before[n].Status.ID, ceps[n].Status.ID)
		}
	}
	if c := ceps["other-node"]; c == nil || c.UID != other.UID {
		t.Errorf("the CEP of another node was deleted or replaced: %v", c)
	}

	// The kubelet comes back: it keeps the surviving sandboxes and tears
	// down those of the deleted pods, which leaves nothing of them.
	if err := e.node.StartKubelet(); err != nil {
		t.Fatal(err)
	}
	e.waitGone(gone, sbs, 60*time.Second)
	now := e.sandboxes()
	for _, n := range keep {
		if now[n].ID != sbs[n].ID {
			t.Errorf("sandbox of %s replaced after the kubelet restart: %s -> %s", n, sbs[n].ID, now[n].ID)
		}
	}

	// A CEP named after a new pod but owned by another pod UID (made by
	// hand on this node) is not overwritten; once it is deleted the
	// agent writes the pod's own.
	conflictOwner := uuid.NewUUID()
	hand := e.handCEP("conflict", e.node.IP.String(), conflictOwner)
	e.createPods(map[string]map[string]string{"conflict": {"app": "keep"}})
	conflictPod := e.waitRunning([]string{"conflict"}, 30*time.Second)["conflict"]
	var ep models.Endpoint
	eventually(t, 20*time.Second, "endpoint of pod conflict ready", func() error {
		eps, err := e.endpoints()
		if err != nil {
			return err
		}
		var ok bool
		if ep, ok = eps["conflict"]; !ok || ep.Status.State != models.EndpointStateReady {
			return fmt.Errorf("endpoint %+v", ep.Status)
		}
		return nil
	})
	for range 3 * 10 { // 3 s after the endpoint is ready
		cur, err := e.cilium.CiliumV2().CiliumEndpoints(e.ns).Get(e.ctx, "conflict", metavOpts)
		if err != nil {
			t.Fatalf("the conflicting CEP disappeared: %v", err)
		}
		if cur.UID != hand.UID || cur.ResourceVersion != hand.ResourceVersion || cur.Status.ID != 4242 {
			t.Fatalf("the agent overwrote a CEP owned by pod UID %s: status %+v", conflictOwner, cur.Status)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := e.cilium.CiliumV2().CiliumEndpoints(e.ns).Delete(e.ctx, "conflict", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the agent's own CEP for pod conflict", func() error {
		ceps, err := e.ceps()
		if err != nil {
			return err
		}
		if err := e.checkCEP(ceps["conflict"], conflictPod); err != nil {
			return err
		}
		if id := ceps["conflict"].Status.ID; id != ep.ID {
			return fmt.Errorf("CEP conflict has endpoint ID %d, want %d", id, ep.ID)
		}
		return nil
	})
}
