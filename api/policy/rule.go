package policy

// Rule is one policy rule: it picks its subjects with EndpointSelector (pods)
// or NodeSelector (nodes, clusterwide policies only) and lists what they may
// receive and send.
//
// A rule with no ingress, ingressDeny, egress or egressDeny section selects
// its subjects but changes nothing for them; Cilium rejects such rules.
type Rule struct {
	// EndpointSelector selects the endpoints this rule applies to. Exactly one
	// of endpointSelector and nodeSelector must be set.
	//
	// +optional
	EndpointSelector *EndpointSelector `json:"endpointSelector,omitempty"`

	// NodeSelector selects the nodes this rule applies to (a host policy).
	// Only valid in a CiliumClusterwideNetworkPolicy.
	//
	// +optional
	NodeSelector *EndpointSelector `json:"nodeSelector,omitempty"`

	// Ingress lists the traffic the subjects may receive.
	//
	// +optional
	Ingress []IngressRule `json:"ingress,omitempty"`

	// IngressDeny lists traffic the subjects must not receive, whatever
	// Ingress allows.
	//
	// +optional
	IngressDeny []IngressDenyRule `json:"ingressDeny,omitempty"`

	// Egress lists the traffic the subjects may send.
	//
	// +optional
	Egress []EgressRule `json:"egress,omitempty"`

	// EgressDeny lists traffic the subjects must not send, whatever Egress
	// allows.
	//
	// +optional
	EgressDeny []EgressDenyRule `json:"egressDeny,omitempty"`

	// Labels are free metadata attached to the rule, for looking it up later.
	// They need not be unique.
	//
	// +optional
	Labels LabelArray `json:"labels,omitempty"`

	// EnableDefaultDeny says, per direction, whether selecting an endpoint
	// with this rule switches that endpoint to deny-by-default. Unset means
	// yes for every direction the rule has sections for.
	//
	// +optional
	EnableDefaultDeny DefaultDenyConfig `json:"enableDefaultDeny,omitzero"`

	// Description is a human-readable note about the rule's purpose.
	//
	// +optional
	Description string `json:"description,omitempty"`

	// Log sets what is recorded with flows this rule decides.
	//
	// +optional
	Log LogConfig `json:"log,omitzero"`
}

// Rules is an ordered list of rules, the form of a policy's `specs`.
type Rules []*Rule

// DefaultDenyConfig chooses deny-by-default per direction. A nil field means
// "decide from the rule's sections".
type DefaultDenyConfig struct {
	// Ingress turns deny-by-default for received traffic on or off.
	//
	// +optional
	Ingress *bool `json:"ingress,omitempty"`

	// Egress turns deny-by-default for sent traffic on or off.
	//
	// +optional
	Egress *bool `json:"egress,omitempty"`
}

// LogConfig holds the per-rule logging settings.
type LogConfig struct {
	// Value is an arbitrary short string copied into the flow records of
	// traffic this rule decides.
	//
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^\PC*$`
	// +optional
	Value string `json:"value,omitempty"`
}

// Label is one piece of rule metadata: a key/value pair tagged with the
// source it came from (for example `k8s` or `unspec`).
type Label struct {
	// Key is the label's name.
	Key string `json:"key"`

	// Value is the label's value; it may be empty.
	//
	// +optional
	Value string `json:"value,omitempty"`

	// Source says where the label came from.
	Source string `json:"source"`
}

// LabelArray is a list of labels.
type LabelArray []Label
