package policy

// AuthenticationMode is how peers of a rule must authenticate.
//
// +kubebuilder:validation:Enum=disabled;required;test-always-fail
type AuthenticationMode string

// The authentication modes.
const (
	AuthenticationModeDisabled   AuthenticationMode = "disabled"
	AuthenticationModeRequired   AuthenticationMode = "required"
	AuthenticationModeAlwaysFail AuthenticationMode = "test-always-fail"
)

// Authentication asks for mutual authentication of the peers of a rule.
type Authentication struct {
	// Mode is the kind of authentication required.
	Mode AuthenticationMode `json:"mode"`
}
