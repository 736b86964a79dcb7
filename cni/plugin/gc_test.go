package plugin

import (
	"reflect"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/datapath/link"
)

func cniEndpoint(cid, ifName string) models.Endpoint {
	return models.Endpoint{Spec: &models.EndpointChangeRequest{
		ContainerID: cid, ContainerInterfaceName: ifName, K8sNamespace: "default", K8sPodName: "pod-" + cid,
	}}
}

func hostLink(name, cid, ifName string) link.HostLink {
	return link.HostLink{Name: name, Kind: "veth", ContainerID: cid, IfName: ifName}
}

func TestPlanGC(t *testing.T) {
	valid := []types.GCAttachment{{ContainerID: "live", IfName: "eth0"}, {ContainerID: "live2", IfName: "net1"}}
	eps := []models.Endpoint{
		cniEndpoint("live", "eth0"),
		cniEndpoint("live2", "net1"),
		cniEndpoint("stale", "eth0"),
		cniEndpoint("stale-noifname", ""),
		// Valid container, another interface: endpoints are deleted by
		// container ID, so it stays with its container.
		cniEndpoint("live", "eth9"),
		// The agent's own endpoint: no pod. Kept, and so is its link.
		{Spec: &models.EndpointChangeRequest{ContainerID: "cellium-health"}},
		// No spec: the plugin cannot tell whose it is. Kept.
		{Status: models.EndpointStatus{ExternalIdentifiers: &models.EndpointIdentifiers{ContainerID: "restored"}}},
	}
	links := []link.HostLink{
		hostLink("lxcaaaaaaaaaaaa", "live", "eth0"),
		hostLink("lxcbbbbbbbbbbbb", "live2", "net1"),
		hostLink("lxccccccccccccc", "stale", "eth0"),
		hostLink("lxcdddddddddddd", "orphan", "eth0"), // the agent never heard of it
		hostLink("lxceeeeeeeeeeee", "cellium-health", "eth0"),
		hostLink("lxcffffffffffff", "restored", "eth0"),
		hostLink("lxcgggggggggggg", "live2", "eth0"), // valid container, other interface
		hostLink("lxc_foreign", "", ""),              // no cellium alias: not ours
		{Name: "lxcbridge", Kind: "bridge", ContainerID: "orphan", IfName: "eth0"},
	}
	got := planGC(valid, eps, links)
	want := gcPlan{
		endpoints: []string{"stale", "stale-noifname"},
		links:     []string{"lxccccccccccccc", "lxcdddddddddddd", "lxcgggggggggggg"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("planGC =\n %+v\nwant\n %+v", got, want)
	}

	// Without valid attachments every CNI endpoint and link is stale, but
	// never the agent's own.
	got = planGC(nil, eps, links)
	want = gcPlan{
		endpoints: []string{"live", "live2", "stale", "stale-noifname"},
		links:     []string{"lxcaaaaaaaaaaaa", "lxcbbbbbbbbbbbb", "lxccccccccccccc", "lxcdddddddddddd", "lxcgggggggggggg"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("planGC(nil) =\n %+v\nwant\n %+v", got, want)
	}
}
