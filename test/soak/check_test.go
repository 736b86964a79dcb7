package soak

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/datapath/link"
	"github.com/cellium/cellium/test/devkubelet"
)

const (
	testNS     = "soak-ns"
	testPrefix = "50a00001"
)

// cleanSnapshot is a node with pods a (identity 1001) and b, c (identity
// 1002, shared), the health endpoint and the router: every invariant
// holds.
func cleanSnapshot() (*Snapshot, *Expect) {
	s := &Snapshot{
		Namespace:  testNS,
		Identities: map[string]bool{"1001": true, "1002": true, "1003": true},
		PodLinks:   map[string][]PodLink{},
		IPAM: []models.IPAMAddress{
			{IP: "10.0.0.1", Owner: RouterOwner},
			{IP: "10.0.0.2", Owner: HealthOwner},
		},
		Endpoints: []models.Endpoint{{
			ID: 1,
			Status: models.EndpointStatus{
				ID: 1, State: models.EndpointStateReady, Identity: &models.EndpointIdentity{ID: 4},
				Networking: &models.EndpointNetworking{Addressing: models.AddressPairList{{IPV4: "10.0.0.2"}}},
			},
		}},
		StateFiles:    []string{"1.json"},
		IPAMStateFile: []string{"10.0.0.2"},
		Allocations:   []Allocation{{ID: 1001, Refs: 1}, {ID: 1002, Refs: 2}},
	}
	pods := []struct {
		name, ip string
		id       int64
		identity int64
	}{{"a", "10.0.0.10", 10, 1001}, {"b", "10.0.0.11", 11, 1002}, {"c", "10.0.0.12", 12, 1002}}
	alive := map[string]bool{}
	for i, p := range pods {
		uid := "uid-" + p.name
		cid := fmt.Sprintf("%s%056d", testPrefix, i)
		host := link.HostInterfaceName(cid, "eth0")
		netns := fmt.Sprintf("cellium-%s-%s-%s", testNS, p.name, cid[:8])
		alive[p.name] = true
		s.Pods = append(s.Pods, Pod{Name: p.name, UID: uid, IP: p.ip, Running: true})
		s.CEPs = append(s.CEPs, CEP{Name: p.name, UID: "cep-" + p.name, OwnerUIDs: []string{uid}, IP: p.ip,
			State: string(ciliumv2.EndpointStateReady), Identity: p.identity, ID: p.id})
		s.Endpoints = append(s.Endpoints, models.Endpoint{
			ID: p.id,
			Spec: &models.EndpointChangeRequest{ContainerID: cid, ContainerInterfaceName: "eth0", K8sNamespace: testNS,
				K8sPodName: p.name, K8sUID: uid, InterfaceName: host, InterfaceIndex: 100 + i},
			Status: models.EndpointStatus{ID: p.id, State: models.EndpointStateReady, Identity: &models.EndpointIdentity{ID: p.identity},
				Networking: &models.EndpointNetworking{Addressing: models.AddressPairList{{IPV4: p.ip}}}},
		})
		s.IPAM = append(s.IPAM, models.IPAMAddress{IP: p.ip, Owner: testNS + "/" + p.name})
		s.IPAMStateFile = append(s.IPAMStateFile, p.ip)
		s.Sandboxes = append(s.Sandboxes, devkubelet.Sandbox{ID: cid, Namespace: testNS, Name: p.name, UID: types.UID(uid),
			NetnsPath: "/var/run/netns/" + netns, IfName: "eth0", State: devkubelet.SandboxReady, IP: p.ip, HostInterfaces: []string{host}})
		s.PodLinks[cid] = []PodLink{{Name: "eth0", Addrs: []string{p.ip}}}
		s.Netns = append(s.Netns, netns)
		s.HostLinks = append(s.HostLinks, link.HostLink{Name: host, Index: 100 + i, ContainerID: cid, IfName: "eth0"})
		s.StateFiles = append(s.StateFiles, fmt.Sprintf("%d.json", p.id))
	}
	// Links of other tests' containers are none of the soak's business.
	s.HostLinks = append(s.HostLinks, link.HostLink{Name: "lxcother", Index: 7, ContainerID: "feedbeef"})
	return s, &Expect{Alive: alive, ContainerPrefix: testPrefix, NetnsPrefixes: []string{"cellium-" + testNS + "-"}}
}

func endpointOf(s *Snapshot, pod string) *models.Endpoint {
	for i := range s.Endpoints {
		if ep := &s.Endpoints[i]; ep.Spec != nil && ep.Spec.K8sPodName == pod {
			return ep
		}
	}
	panic("no endpoint of " + pod)
}

func TestCheckClean(t *testing.T) {
	s, e := cleanSnapshot()
	if vs := Check(s, e); len(vs) > 0 {
		t.Fatalf("a clean node has violations: %v", vs)
	}
}

// TestCheckFindsFaults plants one fault at a time (each a way the issue's
// bugs show on a node) and expects the invariant named for it.
func TestCheckFindsFaults(t *testing.T) {
	tests := []struct {
		name  string
		plant func(s *Snapshot, e *Expect)
		want  string // invariant
	}{
		{"pod never runs", func(s *Snapshot, e *Expect) { s.Pods[0].Running = false }, "pod-not-running"},
		{"deleted pod stays", func(s *Snapshot, e *Expect) { delete(e.Alive, "a") }, "pod-not-gone"},
		{"CEP missing", func(s *Snapshot, e *Expect) { s.CEPs = s.CEPs[1:] }, "cep-missing"},
		{"CEP of another UID", func(s *Snapshot, e *Expect) { s.CEPs[0].OwnerUIDs = []string{"old"} }, "cep-owner"},
		{"CEP with a stale IP", func(s *Snapshot, e *Expect) { s.CEPs[0].IP = "10.0.0.99" }, "cep-ip"},
		{"CEP without pod", func(s *Snapshot, e *Expect) {
			s.CEPs = append(s.CEPs, CEP{Name: "gone", OwnerUIDs: []string{"x"}, IP: "10.0.0.50"})
		}, "cep-stale"},
		{"two endpoints for one pod (ADD into another netns)", func(s *Snapshot, e *Expect) {
			ep := *endpointOf(s, "a")
			ep.ID = 77
			ep.Status.Networking = &models.EndpointNetworking{Addressing: models.AddressPairList{{IPV4: "10.0.0.77"}}}
			s.Endpoints = append(s.Endpoints, ep)
		}, "endpoint-count"},
		{"endpoint replaced by a retried ADD", func(s *Snapshot, e *Expect) {
			endpointOf(s, "a").Status.Networking.Addressing[0].IPV4 = "10.0.0.88"
		}, "endpoint-ip"},
		{"endpoint of another sandbox", func(s *Snapshot, e *Expect) {
			endpointOf(s, "a").Spec.ContainerID = testPrefix + "ff"
		}, "endpoint-container"},
		{"endpoint stuck", func(s *Snapshot, e *Expect) {
			endpointOf(s, "b").Status.State = models.EndpointStateWaitingForIdentity
		}, "endpoint-not-ready"},
		{"endpoint of a deleted pod", func(s *Snapshot, e *Expect) {
			ep := *endpointOf(s, "a")
			ep.ID, ep.Spec = 55, &models.EndpointChangeRequest{K8sNamespace: testNS, K8sPodName: "zombie", ContainerID: "z"}
			s.Endpoints = append(s.Endpoints, ep)
		}, "endpoint-stale"},
		{"leaked IP (rollback never ran)", func(s *Snapshot, e *Expect) {
			s.IPAM = append(s.IPAM, models.IPAMAddress{IP: "10.0.0.66", Owner: testNS + "/a"})
		}, "ipam-leak"},
		{"IP released while in use (double release)", func(s *Snapshot, e *Expect) {
			s.IPAM = slices.DeleteFunc(s.IPAM, func(a models.IPAMAddress) bool { return a.IP == "10.0.0.11" })
		}, "ipam-unallocated"},
		{"IP owned by another pod", func(s *Snapshot, e *Expect) { s.IPAM[3].Owner = testNS + "/other" }, "ipam-owner"},
		{"IPAM state file behind", func(s *Snapshot, e *Expect) { s.IPAMStateFile = s.IPAMStateFile[1:] }, "ipam-state"},
		{"identity released twice", func(s *Snapshot, e *Expect) { s.Allocations[1].Refs = 1 }, "identity-refs"},
		{"identity reference lost", func(s *Snapshot, e *Expect) { s.Allocations = s.Allocations[:1] }, "identity-unreferenced"},
		{"CiliumIdentity deleted in use", func(s *Snapshot, e *Expect) { delete(s.Identities, "1002") }, "identity-object-missing"},
		{"sandbox left", func(s *Snapshot, e *Expect) {
			s.Sandboxes = append(s.Sandboxes, devkubelet.Sandbox{ID: testPrefix + "77", Namespace: testNS, Name: "old"})
		}, "sandbox-stale"},
		{"netns leaked", func(s *Snapshot, e *Expect) { s.Netns = append(s.Netns, "cellium-"+testNS+"-old-12345678") }, "netns-leak"},
		{"pod's eth0 gone (veth deleted by a sweep)", func(s *Snapshot, e *Expect) {
			s.PodLinks[s.Sandboxes[0].ID] = nil
		}, "pod-interface"},
		{"host veth gone", func(s *Snapshot, e *Expect) { s.HostLinks = s.HostLinks[1:] }, "veth-missing"},
		{"veth leaked", func(s *Snapshot, e *Expect) {
			s.HostLinks = append(s.HostLinks, link.HostLink{Name: "lxcleak", Index: 9, ContainerID: testPrefix + "dead"})
		}, "veth-leak"},
		{"state file leaked", func(s *Snapshot, e *Expect) { s.StateFiles = append(s.StateFiles, ".tmp-123") }, "state-file-leak"},
		{"state file missing", func(s *Snapshot, e *Expect) { s.StateFiles = s.StateFiles[1:] }, "state-file-missing"},
		{"no health endpoint", func(s *Snapshot, e *Expect) { s.Endpoints = s.Endpoints[1:]; s.StateFiles = s.StateFiles[1:] }, "endpoint-health"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, e := cleanSnapshot()
			tt.plant(s, e)
			vs := Check(s, e)
			var got []string
			for _, v := range vs {
				got = append(got, v.Invariant)
			}
			if !slices.Contains(got, tt.want) {
				t.Fatalf("want a %s violation, got %v", tt.want, vs)
			}
		})
	}
}

// TestCheckIgnoresOthers: other tests' links and netns names, reserved
// identities without allocation rows and a missing allocations table do
// not count.
func TestCheckIgnoresOthers(t *testing.T) {
	s, e := cleanSnapshot()
	s.Allocations = nil // an agent without the table
	s.IPAMStateFile = nil
	if vs := Check(s, e); len(vs) > 0 {
		t.Fatalf("violations: %v", vs)
	}
}

func TestIdentityWatch(t *testing.T) {
	tl := NewTimeline(10, timeZero, nil)
	w := newIdentityWatch(tl, func() {})
	w.ceps["u-a"] = cepRef{name: "a", identity: 1001}
	w.ceps["u-b"] = cepRef{name: "b", identity: 1002}
	w.ceps["u-c"] = cepRef{name: "c", identity: 1002}
	w.deleted(1002)
	// c moved to another identity meanwhile: not a suspect any more.
	h := w.cepHandler()
	h.OnUpdate(nil, cepObject("c", "u-c", 1003))
	s := &Snapshot{CEPs: []CEP{{Name: "a", UID: "u-a", Identity: 1001}, {Name: "b", UID: "u-b", Identity: 1002}, {Name: "c", UID: "u-c", Identity: 1003}}}
	vs := w.check(s, map[string]bool{"a": true, "b": true, "c": true})
	if len(vs) != 1 || vs[0].Invariant != "identity-deleted-in-use" || !strings.Contains(vs[0].Message, "CEP b") {
		t.Fatalf("check = %v, want one identity-deleted-in-use for CEP b", vs)
	}
	if vs := w.check(s, map[string]bool{"b": true}); len(vs) != 0 {
		t.Fatalf("suspects not forgotten after a check: %v", vs)
	}
	if w.Deletions() != 1 {
		t.Errorf("Deletions = %d", w.Deletions())
	}
}
