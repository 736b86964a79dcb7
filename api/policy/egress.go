package policy

// EgressCommonRule lists the peers traffic may go to. The peer kinds
// (endpoints, nodes, CIDRs, CIDR sets, entities, services, groups) are
// combined with OR.
type EgressCommonRule struct {
	// ToEndpoints selects destination endpoints by label. Unset together with
	// toPorts means any destination; an empty list selects none; a list
	// holding one empty selector selects every endpoint.
	//
	// +optional
	ToEndpoints []EndpointSelector `json:"toEndpoints,omitempty"`

	// ToRequires is deprecated and must be empty.
	//
	// +kubebuilder:validation:MaxItems=0
	// +optional
	ToRequires []EndpointSelector `json:"toRequires,omitempty"`

	// ToCIDR lists destination prefixes.
	//
	// +optional
	ToCIDR CIDRSlice `json:"toCIDR,omitempty"`

	// ToCIDRSet lists destination address blocks, with exceptions.
	//
	// +optional
	ToCIDRSet CIDRRuleSlice `json:"toCIDRSet,omitempty"`

	// ToEntities lists destination entities.
	//
	// +optional
	ToEntities EntitySlice `json:"toEntities,omitempty"`

	// ToServices lists destination Kubernetes services, by name or by label.
	//
	// +optional
	ToServices []Service `json:"toServices,omitempty"`

	// ToGroups lists destinations defined by a cloud provider.
	//
	// +optional
	ToGroups []Groups `json:"toGroups,omitempty"`

	// ToNodes selects destination nodes by node label.
	//
	// +optional
	ToNodes []EndpointSelector `json:"toNodes,omitempty"`
}

// EgressRule allows traffic to the peers of its EgressCommonRule or to the
// names in ToFQDNs, limited to ToPorts and ICMPs when those are set.
type EgressRule struct {
	EgressCommonRule `json:",inline"`

	// ToPorts limits the rule to these destination ports, with optional L7
	// rules.
	//
	// +optional
	ToPorts PortRules `json:"toPorts,omitempty"`

	// ToFQDNs allows destinations by DNS name, as resolved by the peers.
	//
	// +optional
	ToFQDNs FQDNSelectorSlice `json:"toFQDNs,omitempty"`

	// ICMPs limits the rule to these ICMP types.
	//
	// +optional
	ICMPs ICMPRules `json:"icmps,omitempty"`

	// Authentication requires the peers to authenticate before traffic passes.
	//
	// +optional
	Authentication *Authentication `json:"authentication,omitempty"`
}

// EgressDenyRule denies traffic to the peers of its EgressCommonRule,
// limited to ToPorts and ICMPs when those are set.
type EgressDenyRule struct {
	EgressCommonRule `json:",inline"`

	// ToPorts limits the denial to these destination ports.
	//
	// +optional
	ToPorts PortDenyRules `json:"toPorts,omitempty"`

	// ICMPs limits the denial to these ICMP types.
	//
	// +optional
	ICMPs ICMPRules `json:"icmps,omitempty"`
}
