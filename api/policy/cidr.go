package policy

// CIDR is an IPv4 or IPv6 prefix in CIDR notation, such as `10.0.0.0/8` or
// `2001:db8::/32`.
//
// +kubebuilder:validation:Format=cidr
type CIDR string

// CIDRSlice is a list of prefixes.
type CIDRSlice []CIDR

// CIDRGroupRef names a CiliumCIDRGroup object.
//
// +kubebuilder:validation:MaxLength=253
// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
type CIDRGroupRef string

// CIDRRule names a block of addresses in one of three ways (a literal prefix,
// a CIDR group by name, or CIDR groups by label) and may carve
// sub-prefixes out of it. Exactly one of cidr, cidrGroupRef and
// cidrGroupSelector should be set.
type CIDRRule struct {
	// Cidr is the address block as a prefix.
	//
	// +optional
	Cidr CIDR `json:"cidr,omitempty"`

	// CIDRGroupRef takes the address blocks from the named CiliumCIDRGroup.
	//
	// +optional
	CIDRGroupRef CIDRGroupRef `json:"cidrGroupRef,omitempty"`

	// CIDRGroupSelector takes the address blocks from every CiliumCIDRGroup
	// whose labels it matches.
	//
	// +optional
	CIDRGroupSelector *EndpointSelector `json:"cidrGroupSelector,omitempty"`

	// ExceptCIDRs are sub-prefixes of the block that the rule does not cover.
	//
	// +optional
	ExceptCIDRs []CIDR `json:"except,omitempty"`
}

// CIDRRuleSlice is a list of CIDR rules.
type CIDRRuleSlice []CIDRRule
