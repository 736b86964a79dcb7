package policy

// Service picks Kubernetes services as egress destinations, either by name or
// by label. Exactly one field should be set.
type Service struct {
	// K8sServiceSelector picks services by label.
	//
	// +optional
	K8sServiceSelector *K8sServiceSelectorNamespace `json:"k8sServiceSelector,omitempty"`

	// K8sService picks one service by name.
	//
	// +optional
	K8sService *K8sServiceNamespace `json:"k8sService,omitempty"`
}

// K8sServiceNamespace names one service.
type K8sServiceNamespace struct {
	// ServiceName is the service's name.
	//
	// +optional
	ServiceName string `json:"serviceName,omitempty"`

	// Namespace is the service's namespace; empty means the policy's.
	//
	// +optional
	Namespace string `json:"namespace,omitempty"`
}

// K8sServiceSelectorNamespace picks services by label within a namespace.
type K8sServiceSelectorNamespace struct {
	// Selector matches service labels.
	Selector ServiceSelector `json:"selector"`

	// Namespace limits the match to one namespace; empty means the policy's.
	//
	// +optional
	Namespace string `json:"namespace,omitempty"`
}

// ServiceSelector is a label selector applied to services.
type ServiceSelector EndpointSelector
