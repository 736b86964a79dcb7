package policy

import "k8s.io/apimachinery/pkg/util/intstr"

// ICMPRule allows (or denies) ICMP messages of the listed types.
type ICMPRule struct {
	// Fields are the ICMP types covered.
	//
	// +kubebuilder:validation:MaxItems=40
	// +optional
	Fields []ICMPField `json:"fields,omitempty"`
}

// ICMPRules is a list of ICMP rules.
type ICMPRules []ICMPRule

// ICMPField is one ICMP type of one address family.
type ICMPField struct {
	// Family is IPv4 (the default) or IPv6.
	//
	// +kubebuilder:validation:Enum=IPv4;IPv6
	// +kubebuilder:default=IPv4
	// +optional
	Family string `json:"family,omitempty"`

	// Type is the ICMP type, as a number (0 to 255) or a name such as
	// EchoRequest.
	Type *intstr.IntOrString `json:"type"`
}

// The ICMP families.
const (
	ICMPFamilyIPv4 = "IPv4"
	ICMPFamilyIPv6 = "IPv6"
)
