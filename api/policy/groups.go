package policy

// Groups names peers defined outside Kubernetes by a cloud provider.
type Groups struct {
	// AWS selects EC2 resources by tag or security group.
	//
	// +optional
	AWS *AWSGroup `json:"aws,omitempty"`
}

// AWSGroup selects AWS network interfaces by tags, security groups and region.
type AWSGroup struct {
	// Labels are EC2 tags to match.
	//
	// +optional
	Labels map[string]string `json:"labels,omitempty"`

	// SecurityGroupsIds are security group IDs to match.
	//
	// +optional
	SecurityGroupsIds []string `json:"securityGroupsIds,omitempty"`

	// SecurityGroupsNames are security group names to match.
	//
	// +optional
	SecurityGroupsNames []string `json:"securityGroupsNames,omitempty"`

	// Region limits the match to one AWS region.
	//
	// +optional
	Region string `json:"region,omitempty"`
}
