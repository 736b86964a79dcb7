package parser

import (
	"net/netip"
	"slices"
	"strings"

	flowpb "github.com/cilium/cilium/api/v1/flow"

	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/identity"
	"github.com/cellium/cellium/statedb/ipcache"
	"github.com/cellium/cellium/statedb/labels"
)

// end is one resolved end of a flow.
type end struct {
	flow  *flowpb.Endpoint
	node  string              // the node the address lives on, "" if unknown
	local *endpoints.Endpoint // the local endpoint holding the address
}

// endpoint resolves the end of a flow with address ip, whose identity
// the datapath saw as dpID (0: not known to the datapath). The
// datapath's identity wins over the tables' (it is what the policy
// decision was taken on; the tables may have moved on), as in Hubble.
//
//  1. A local endpoint: its ID, pod, identity labels and workloads; the
//     node is this one.
//  2. Else the ipcache row holding ip: a remote pod (a CiliumEndpoint's
//     row names the pod), a node, the host, a pod CIDR of another node,
//     a policy CIDR; the node from the row's tunnel endpoint.
//  3. Else world (the datapath's ipcache miss).
func (p *Parser) endpoint(ip netip.Addr, dpID uint32) end {
	id := identity.NumericIdentity(dpID)
	var out end
	if ip.IsValid() && p.src.Endpoints != nil {
		if ep, ok := p.src.Endpoints.EndpointByIP(ip); ok {
			if id == 0 {
				id = ep.Identity
			}
			e := &flowpb.Endpoint{ID: uint32(ep.ID), Identity: uint32(id), Namespace: ep.PodNamespace, PodName: ep.PodName}
			e.Labels = p.labelsOf(id)
			if e.Labels == nil && id == ep.Identity {
				e.Labels = SortedLabels(ep.Labels)
			}
			if ep.PodName != "" && p.src.Workloads != nil {
				e.Workloads = p.src.Workloads.PodWorkloads(ep.PodNamespace, ep.PodName)
			}
			e.ClusterName = clusterOf(e.Labels)
			return end{flow: e, node: p.nodeName, local: ep}
		}
	}
	e := &flowpb.Endpoint{}
	out.flow = e
	var row *ipcache.Entry
	if ip.IsValid() && p.src.IPCache != nil {
		row, _ = p.src.IPCache.LookupIP(ip)
	}
	if row == nil {
		if id == 0 {
			id = identity.ReservedIdentityWorld
		}
		e.Identity = uint32(id)
		e.Labels = p.labelsOf(id)
		e.ClusterName = clusterOf(e.Labels)
		return out
	}
	if id == 0 {
		id = row.Identity
	}
	e.Identity = uint32(id)
	e.Labels = p.labelsOf(id)
	switch row.Source {
	case ipcache.SourceCiliumEndpoint:
		if key, ok := strings.CutPrefix(row.Owner, "cep "); ok {
			e.Namespace, e.PodName, _ = strings.Cut(key, "/")
		}
	case ipcache.SourceHost:
		out.node = p.nodeName
	case ipcache.SourceRemoteNode:
		out.node, _ = strings.CutPrefix(row.Owner, "node ")
	case ipcache.SourcePolicyCIDR:
		if e.Labels == nil {
			e.Labels = []string{labels.SourceCIDR + ":" + row.Prefix.String(), labels.Reserved(labels.IDNameWorld).String()}
		}
	}
	if out.node == "" && row.HostIP.IsValid() && p.src.Nodes != nil {
		out.node, _ = p.src.Nodes.NodeNameByIP(row.HostIP)
	}
	e.ClusterName = clusterOf(e.Labels)
	return out
}

// clusterPrefix starts the label naming an endpoint's cluster.
const clusterPrefix = labels.SourceK8s + ":" + labels.PolicyLabelCluster + "="

// clusterOf returns the cluster name the labels carry, as Hubble fills
// Endpoint.cluster_name.
func clusterOf(lbls []string) string {
	for _, l := range lbls {
		if c, ok := strings.CutPrefix(l, clusterPrefix); ok {
			return c
		}
	}
	return ""
}

// labelsOf returns the labels of identity id: from Identities, else a
// reserved identity's own labels; nil when unknown.
func (p *Parser) labelsOf(id identity.NumericIdentity) []string {
	if p.src.Identities != nil {
		if l, ok := p.src.Identities.IdentityLabels(id); ok {
			return l
		}
	}
	return p.reserved[id]
}

// SortedLabels returns labels as Hubble prints them, "source:key=value"
// ("k8s:app=web", "reserved:world"), sorted.
func SortedLabels(l labels.Labels) []string {
	if l.Len() == 0 {
		return nil
	}
	out := l.Strings()
	slices.Sort(out)
	return out
}
