package policy

// FQDNSelector matches DNS names, exactly or by wildcard pattern. Exactly one
// of its fields should be set.
type FQDNSelector struct {
	// MatchName is a full DNS name to match.
	//
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:Pattern=`^([-a-zA-Z0-9_]+[.]?)+$`
	// +optional
	MatchName string `json:"matchName,omitempty"`

	// MatchPattern matches DNS names with `*` standing for any run of
	// characters valid in a name (`**.` also crosses dots).
	//
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:Pattern=`^([-a-zA-Z0-9_*]+[.]?)+$`
	// +optional
	MatchPattern string `json:"matchPattern,omitempty"`
}

// FQDNSelectorSlice is a list of FQDN selectors.
type FQDNSelectorSlice []FQDNSelector
