package policy

// IngressCommonRule lists the peers traffic may come from. The peer kinds
// (endpoints, nodes, CIDRs, CIDR sets, entities, groups) are combined with OR.
type IngressCommonRule struct {
	// FromEndpoints selects source endpoints by label. Unset together with
	// toPorts means any source; an empty list selects none; a list holding
	// one empty selector selects every endpoint.
	//
	// +optional
	FromEndpoints []EndpointSelector `json:"fromEndpoints,omitempty"`

	// FromRequires is deprecated and must be empty.
	//
	// +kubebuilder:validation:MaxItems=0
	// +optional
	FromRequires []EndpointSelector `json:"fromRequires,omitempty"`

	// FromCIDR lists source prefixes.
	//
	// +optional
	FromCIDR CIDRSlice `json:"fromCIDR,omitempty"`

	// FromCIDRSet lists source address blocks, with exceptions.
	//
	// +optional
	FromCIDRSet CIDRRuleSlice `json:"fromCIDRSet,omitempty"`

	// FromEntities lists source entities.
	//
	// +optional
	FromEntities EntitySlice `json:"fromEntities,omitempty"`

	// FromGroups lists sources defined by a cloud provider (security groups).
	//
	// +optional
	FromGroups []Groups `json:"fromGroups,omitempty"`

	// FromNodes selects source nodes by node label.
	//
	// +optional
	FromNodes []EndpointSelector `json:"fromNodes,omitempty"`
}

// IngressRule allows traffic from the peers of its IngressCommonRule, limited
// to ToPorts and ICMPs when those are set.
type IngressRule struct {
	IngressCommonRule `json:",inline"`

	// ToPorts limits the rule to these destination ports, with optional L7
	// rules.
	//
	// +optional
	ToPorts PortRules `json:"toPorts,omitempty"`

	// ICMPs limits the rule to these ICMP types.
	//
	// +optional
	ICMPs ICMPRules `json:"icmps,omitempty"`

	// Authentication requires the peers to authenticate before traffic passes.
	//
	// +optional
	Authentication *Authentication `json:"authentication,omitempty"`
}

// IngressDenyRule denies traffic from the peers of its IngressCommonRule,
// limited to ToPorts and ICMPs when those are set.
type IngressDenyRule struct {
	IngressCommonRule `json:",inline"`

	// ToPorts limits the denial to these destination ports.
	//
	// +optional
	ToPorts PortDenyRules `json:"toPorts,omitempty"`

	// ICMPs limits the denial to these ICMP types.
	//
	// +optional
	ICMPs ICMPRules `json:"icmps,omitempty"`
}
