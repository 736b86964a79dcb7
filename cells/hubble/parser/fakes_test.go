package parser

import (
	"net/netip"

	flowpb "github.com/cilium/cilium/api/v1/flow"

	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/ipcache"
	"github.com/cellium/cellium/statedb/labels"
	"github.com/cellium/cellium/statedb/lb"
	"github.com/cellium/cellium/statedb/policy"
)

// fakes implements every Sources interface from maps.
type fakes struct {
	eps       map[netip.Addr]*endpoints.Endpoint
	workloads map[string][]*flowpb.Workload // "ns/name"
	ipc       []*ipcache.Entry
	nodes     map[netip.Addr]string
	ids       map[identity.NumericIdentity][]string
	svcs      map[lb.L4Addr]*flowpb.Service
	pols      map[uint16]*policy.EndpointPolicy
}

func (f *fakes) EndpointByIP(ip netip.Addr) (*endpoints.Endpoint, bool) {
	ep, ok := f.eps[ip]
	return ep, ok
}

func (f *fakes) PodWorkloads(ns, name string) []*flowpb.Workload { return f.workloads[ns+"/"+name] }

func (f *fakes) LookupIP(ip netip.Addr) (*ipcache.Entry, bool) {
	var best *ipcache.Entry
	for _, e := range f.ipc {
		if e.Prefix.Contains(ip) && (best == nil || e.Prefix.Bits() > best.Prefix.Bits()) {
			best = e
		}
	}
	return best, best != nil
}

func (f *fakes) NodeNameByIP(ip netip.Addr) (string, bool) {
	n, ok := f.nodes[ip]
	return n, ok
}

func (f *fakes) IdentityLabels(id identity.NumericIdentity) ([]string, bool) {
	l, ok := f.ids[id]
	return l, ok
}

func (f *fakes) ServiceByFrontend(a lb.L4Addr) (*flowpb.Service, bool) {
	s, ok := f.svcs[a]
	return s, ok
}

func (f *fakes) EndpointPolicy(id uint16) (*policy.EndpointPolicy, bool) {
	p, ok := f.pols[id]
	return p, ok
}

func (f *fakes) NodeLabels(name string) []string {
	if name == "node-1" {
		return []string{"kubernetes.io/hostname=node-1", "zone=a"}
	}
	return nil
}

func (f *fakes) sources() Sources {
	return Sources{Endpoints: f, Workloads: f, IPCache: f, Nodes: f, Identities: f, Services: f, Policies: f, NodeLabels: f}
}

var (
	webIP    = netip.MustParseAddr("10.0.1.10")
	clientIP = netip.MustParseAddr("10.0.1.11")
	remoteIP = netip.MustParseAddr("10.0.2.20")
	node2IP  = netip.MustParseAddr("192.168.0.2")
	worldIP  = netip.MustParseAddr("8.8.8.8")
	svcIP    = netip.MustParseAddr("10.96.0.10")
	cidrIP   = netip.MustParseAddr("172.16.5.5")
)

const (
	webID    identity.NumericIdentity = 1001
	clientID identity.NumericIdentity = 1002
	remoteID identity.NumericIdentity = 1003
	cidrID   identity.NumericIdentity = 16777217
)

func podLabels(app string) []string {
	return []string{"k8s:app=" + app, "k8s:io.cilium.k8s.policy.cluster=default",
		"k8s:io.kubernetes.pod.namespace=demo"}
}

// world is node-1 with pods web (endpoint 12) and client (endpoint 13),
// a pod db on node-2, a policy CIDR and a Service.
func world() *fakes {
	allowWeb := policy.Entry{Key: policy.NewKey(clientID, policy.Ingress, policy.ProtoTCP, 80, 16),
		DerivedFrom: []string{"CiliumNetworkPolicy/demo/allow-web"}}
	denyDB := policy.Entry{Key: policy.NewKey(remoteID, policy.Egress, policy.ProtoTCP, 5432, 16), Deny: true,
		DerivedFrom: []string{"CiliumNetworkPolicy/demo/no-db", "CiliumNetworkPolicy/demo/no-db[1]"}}
	allowAllEgress := policy.Entry{Key: policy.NewKey(0, policy.Egress, 0, 0, 0), DerivedFrom: []string{"CiliumClusterwideNetworkPolicy/egress-all"}}
	ipBlock := policy.Entry{Key: policy.NewKey(cidrID, policy.Ingress, policy.ProtoTCP, 9000, 16), DerivedFrom: []string{"NetworkPolicy/demo/ipblock"}}
	icmp := policy.Entry{Key: policy.NewKey(clientID, policy.Ingress, policy.ProtoICMP, 8, 16), DerivedFrom: []string{"NetworkPolicy/demo/ping"}}
	return &fakes{
		eps: map[netip.Addr]*endpoints.Endpoint{
			webIP: {ID: 12, PodNamespace: "demo", PodName: "web-1", IPv4: webIP, Identity: webID,
				HostIfName: "lxc12", HostIfIndex: 40, Labels: labels.ParseLabels("k8s:app=web")},
			clientIP: {ID: 13, PodNamespace: "demo", PodName: "client", IPv4: clientIP, Identity: clientID,
				HostIfName: "lxc13", HostIfIndex: 41},
		},
		workloads: map[string][]*flowpb.Workload{"demo/web-1": {{Kind: "Deployment", Name: "web"}}},
		ipc: []*ipcache.Entry{
			{Prefix: netip.PrefixFrom(remoteIP, 32), Identity: remoteID, Source: ipcache.SourceCiliumEndpoint, Owner: "cep demo/db-0", HostIP: node2IP,
				CIDRIdentity: cidrID},
			{Prefix: netip.PrefixFrom(node2IP, 32), Identity: identity.ReservedIdentityRemoteNode, Source: ipcache.SourceRemoteNode, Owner: "node node-2"},
			{Prefix: netip.MustParsePrefix("10.0.2.0/24"), Identity: identity.ReservedIdentityWorld, Source: ipcache.SourceNodeCIDR, Owner: "node node-2", HostIP: node2IP},
			{Prefix: netip.MustParsePrefix("172.16.0.0/16"), Identity: cidrID, Source: ipcache.SourcePolicyCIDR, Owner: "cidr 172.16.0.0/16"},
			{Prefix: netip.MustParsePrefix("192.168.0.1/32"), Identity: identity.ReservedIdentityHost, Source: ipcache.SourceHost, Owner: "local-node"},
		},
		nodes: map[netip.Addr]string{node2IP: "node-2"},
		ids: map[identity.NumericIdentity][]string{
			webID: podLabels("web"), clientID: podLabels("client"), remoteID: podLabels("db"),
		},
		svcs: map[lb.L4Addr]*flowpb.Service{{Addr: svcIP, Port: 80, Proto: lb.TCP}: {Name: "web", Namespace: "demo"}},
		pols: map[uint16]*policy.EndpointPolicy{
			12: {Revision: 7,
				Ingress: policy.DirectionPolicy{Enforcing: true, Entries: sorted(allowWeb, icmp, ipBlock),
					EnforcedBy: []string{"CiliumNetworkPolicy/demo/allow-web", "NetworkPolicy/demo/deny-all"}},
				Egress: policy.DirectionPolicy{Entries: []policy.Entry{{Key: policy.NewKey(0, policy.Egress, 0, 0, 0)}}}},
			13: {Revision: 7,
				Ingress: policy.DirectionPolicy{Entries: []policy.Entry{{Key: policy.NewKey(0, policy.Ingress, 0, 0, 0)}}},
				Egress:  policy.DirectionPolicy{Enforcing: true, Entries: sorted(denyDB, allowAllEgress)}},
		},
	}
}

func sorted(es ...policy.Entry) []policy.Entry {
	for i := range es {
		for j := i + 1; j < len(es); j++ {
			if es[j].Key.Compare(es[i].Key) < 0 {
				es[i], es[j] = es[j], es[i]
			}
		}
	}
	return es
}
