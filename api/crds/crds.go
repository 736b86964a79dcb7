// Package crds carries the CustomResourceDefinitions of the cilium.io
// resources cellium serves, generated from the types in api/cilium.io by
// hack/update-codegen.sh and embedded into the binary so that the operator
// can register them.
package crds

import (
	"embed"
	"fmt"
	"io/fs"
	"path"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

// The names of the CRDs in this package, `<plural>.cilium.io`.
const (
	CiliumEndpointName                 = "ciliumendpoints.cilium.io"
	CiliumIdentityName                 = "ciliumidentities.cilium.io"
	CiliumNodeName                     = "ciliumnodes.cilium.io"
	CiliumNetworkPolicyName            = "ciliumnetworkpolicies.cilium.io"
	CiliumClusterwideNetworkPolicyName = "ciliumclusterwidenetworkpolicies.cilium.io"
	CiliumEndpointSliceName            = "ciliumendpointslices.cilium.io"
	CiliumLoadBalancerIPPoolName       = "ciliumloadbalancerippools.cilium.io"
)

//go:embed *.yaml
var manifests embed.FS

// All decodes the embedded CRD manifests, one per resource, ordered by file
// name. Every call returns fresh objects that the caller may modify.
//
// An error means a manifest is not a valid CustomResourceDefinition, which
// can only follow from a broken build of this package.
func All() ([]*apiextensionsv1.CustomResourceDefinition, error) {
	files, err := fs.Glob(manifests, "*.yaml")
	if err != nil {
		return nil, fmt.Errorf("list embedded CRD manifests: %w", err)
	}
	out := make([]*apiextensionsv1.CustomResourceDefinition, 0, len(files))
	for _, name := range files {
		crd, err := decode(name)
		if err != nil {
			return nil, err
		}
		out = append(out, crd)
	}
	return out, nil
}

func decode(name string) (*apiextensionsv1.CustomResourceDefinition, error) {
	data, err := manifests.ReadFile(name)
	if err != nil {
		return nil, fmt.Errorf("read CRD manifest %s: %w", name, err)
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.UnmarshalStrict(data, crd); err != nil {
		return nil, fmt.Errorf("decode CRD manifest %s: %w", path.Base(name), err)
	}
	if crd.APIVersion != apiextensionsv1.SchemeGroupVersion.String() || crd.Kind != "CustomResourceDefinition" {
		return nil, fmt.Errorf("decode CRD manifest %s: unexpected %s %s", name, crd.APIVersion, crd.Kind)
	}
	return crd, nil
}
