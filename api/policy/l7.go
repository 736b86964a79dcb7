package policy

// L7Rules are application-protocol rules attached to a port rule. At most one
// protocol may be used per port rule.
type L7Rules struct {
	// HTTP rules; traffic passes when any of them matches.
	//
	// +optional
	HTTP []PortRuleHTTP `json:"http,omitempty"`

	// Kafka rules; traffic passes when any of them matches.
	//
	// +optional
	Kafka []PortRuleKafka `json:"kafka,omitempty"`

	// DNS rules; queries pass when any of them matches.
	//
	// +optional
	DNS []PortRuleDNS `json:"dns,omitempty"`

	// L7Proto names a generic L7 parser to use for L7.
	//
	// +optional
	L7Proto string `json:"l7proto,omitempty"`

	// L7 are key/value rules for the parser named by L7Proto.
	//
	// +optional
	L7 []PortRuleL7 `json:"l7,omitempty"`
}

// PortRuleHTTP matches HTTP requests. Empty fields match anything; Path,
// Method and Host are extended POSIX regular expressions.
type PortRuleHTTP struct {
	// Path matches the request path.
	//
	// +optional
	Path string `json:"path,omitempty"`

	// Method matches the request method.
	//
	// +optional
	Method string `json:"method,omitempty"`

	// Host matches the request host.
	//
	// +optional
	Host string `json:"host,omitempty"`

	// Headers are headers that must be present, as `Name` or `Name: value`.
	//
	// +optional
	Headers []string `json:"headers,omitempty"`

	// HeaderMatches check header values, possibly taken from a secret, and
	// say what to do on a mismatch.
	//
	// +optional
	HeaderMatches []*HeaderMatch `json:"headerMatches,omitempty"`
}

// MismatchAction is what the proxy does when a HeaderMatch fails.
//
// +kubebuilder:validation:Enum=LOG;ADD;DELETE;REPLACE
type MismatchAction string

// The mismatch actions.
const (
	MismatchActionLog     MismatchAction = "LOG"
	MismatchActionAdd     MismatchAction = "ADD"
	MismatchActionDelete  MismatchAction = "DELETE"
	MismatchActionReplace MismatchAction = "REPLACE"
)

// HeaderMatch requires an HTTP header to have a value.
type HeaderMatch struct {
	// Mismatch, when set, lets a non-matching request pass after the action;
	// unset means the request is denied.
	//
	// +optional
	Mismatch MismatchAction `json:"mismatch,omitempty"`

	// Name of the header.
	Name string `json:"name"`

	// Secret holds the expected value, instead of Value.
	//
	// +optional
	Secret *Secret `json:"secret,omitempty"`

	// Value is the expected value.
	//
	// +optional
	Value string `json:"value,omitempty"`
}

// PortRuleKafka matches Kafka requests.
type PortRuleKafka struct {
	// Role is a shorthand for a group of API keys.
	//
	// +kubebuilder:validation:Enum=produce;consume
	// +optional
	Role string `json:"role,omitempty"`

	// APIKey is the Kafka request type, by name.
	//
	// +optional
	APIKey string `json:"apiKey,omitempty"`

	// APIVersion is the request version.
	//
	// +optional
	APIVersion string `json:"apiVersion,omitempty"`

	// ClientID matches the client identifier.
	//
	// +optional
	ClientID string `json:"clientID,omitempty"`

	// Topic matches the topic.
	//
	// +optional
	Topic string `json:"topic,omitempty"`
}

// PortRuleDNS matches DNS queries by name; it has the shape of an
// FQDNSelector.
type PortRuleDNS FQDNSelector

// PortRuleL7 is a generic L7 rule: key/value pairs interpreted by the parser
// named in L7Rules.L7Proto.
type PortRuleL7 map[string]string
