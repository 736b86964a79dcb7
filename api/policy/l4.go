package policy

// L4Proto is an IP protocol name as used in port rules. The empty string
// means ANY.
//
// +kubebuilder:validation:Enum=TCP;UDP;SCTP;VRRP;IGMP;GRE;IPIP;IPV6;ESP;AH;ANY
type L4Proto string

// The protocols a port rule may name.
const (
	ProtoTCP  L4Proto = "TCP"
	ProtoUDP  L4Proto = "UDP"
	ProtoSCTP L4Proto = "SCTP"
	ProtoVRRP L4Proto = "VRRP"
	ProtoIGMP L4Proto = "IGMP"
	ProtoGRE  L4Proto = "GRE"
	ProtoIPIP L4Proto = "IPIP"
	ProtoIPV6 L4Proto = "IPV6"
	ProtoESP  L4Proto = "ESP"
	ProtoAH   L4Proto = "AH"
	ProtoAny  L4Proto = "ANY"
)

// PortProtocol is a port (or port range) and protocol.
type PortProtocol struct {
	// Port is a port number (0 to 65535, 0 meaning every port) or the name of
	// a container port.
	//
	// +kubebuilder:validation:Pattern=`^(6553[0-5]|655[0-2][0-9]|65[0-4][0-9][0-9]|6[0-4][0-9]{3}|[1-5][0-9]{4}|[0-9]{1,4})$|^([a-zA-Z0-9]-?)*[a-zA-Z](-?[a-zA-Z0-9])*$`
	// +optional
	Port string `json:"port,omitempty"`

	// EndPort, when set, makes Port the start of a range ending here.
	//
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=65535
	// +optional
	EndPort int32 `json:"endPort,omitempty"`

	// Protocol is the L4 protocol; empty means any.
	//
	// +optional
	Protocol L4Proto `json:"protocol,omitempty"`
}

// PortRule allows traffic on a set of ports, optionally subject to L7 rules
// enforced by a proxy.
type PortRule struct {
	// Ports are the ports and protocols this rule covers.
	//
	// +kubebuilder:validation:MaxItems=40
	// +optional
	Ports []PortProtocol `json:"ports,omitempty"`

	// TerminatingTLS has the proxy end TLS sessions from the client.
	//
	// +optional
	TerminatingTLS *TLSContext `json:"terminatingTLS,omitempty"`

	// OriginatingTLS has the proxy start TLS sessions to the server.
	//
	// +optional
	OriginatingTLS *TLSContext `json:"originatingTLS,omitempty"`

	// ServerNames limits the rule to TLS connections for these SNI names.
	//
	// +optional
	ServerNames []ServerName `json:"serverNames,omitempty"`

	// Listener sends the traffic to a named Envoy listener.
	//
	// +optional
	Listener *Listener `json:"listener,omitempty"`

	// Rules are L7 rules the traffic must also match.
	//
	// +optional
	Rules *L7Rules `json:"rules,omitempty"`
}

// PortRules is a list of port rules.
type PortRules []PortRule

// PortDenyRule denies traffic on a set of ports. Deny rules take no L7 part.
type PortDenyRule struct {
	// Ports are the ports and protocols denied.
	//
	// +kubebuilder:validation:MaxItems=40
	// +optional
	Ports []PortProtocol `json:"ports,omitempty"`
}

// PortDenyRules is a list of port deny rules.
type PortDenyRules []PortDenyRule

// ServerName is a TLS SNI host name.
type ServerName string

// Secret refers to a Kubernetes Secret.
type Secret struct {
	// Namespace of the secret; empty means the agent's configured default.
	//
	// +optional
	Namespace string `json:"namespace,omitempty"`

	// Name of the secret.
	Name string `json:"name"`
}

// TLSContext gives the proxy the certificates for one side of a TLS session.
type TLSContext struct {
	// Secret holds the TLS material under the keys ca.crt, tls.crt and tls.key.
	Secret *Secret `json:"secret"`

	// TrustedCA is the key in the secret holding trusted CA certificates.
	//
	// +optional
	TrustedCA string `json:"trustedCA,omitempty"`

	// Certificate is the key in the secret holding the certificate chain.
	//
	// +optional
	Certificate string `json:"certificate,omitempty"`

	// PrivateKey is the key in the secret holding the private key.
	//
	// +optional
	PrivateKey string `json:"privateKey,omitempty"`
}

// Listener names an Envoy listener defined in a Cilium(Clusterwide)EnvoyConfig.
type Listener struct {
	// EnvoyConfig is the object that defines the listener.
	EnvoyConfig *EnvoyConfig `json:"envoyConfig"`

	// Name of the listener inside that object.
	Name string `json:"name"`

	// Priority orders listeners when several rules name one for the same
	// port; lower wins.
	//
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +optional
	Priority uint8 `json:"priority,omitempty"`
}

// EnvoyConfig refers to a CiliumEnvoyConfig or CiliumClusterwideEnvoyConfig.
type EnvoyConfig struct {
	// Kind of the object; empty means the clusterwide kind for clusterwide
	// policies and the namespaced one otherwise.
	//
	// +kubebuilder:validation:Enum=CiliumEnvoyConfig;CiliumClusterwideEnvoyConfig
	// +optional
	Kind string `json:"kind,omitempty"`

	// Name of the object.
	Name string `json:"name"`
}
