package v2alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v2 "github.com/cellium/cellium/api/cilium.io/v2"
)

// CoreFromCiliumEndpoint returns what a slice keeps of cep: its name,
// security identity (0 when it has none yet), the UID of the pod that
// owns it, its networking, encryption key, named ports and service
// account. The returned value shares no memory with cep.
func CoreFromCiliumEndpoint(cep *v2.CiliumEndpoint) CoreCiliumEndpoint {
	c := CoreCiliumEndpoint{Name: cep.Name, ServiceAccount: cep.Status.ServiceAccount, Encryption: cep.Status.Encryption}
	if cep.Status.Identity != nil {
		c.IdentityID = cep.Status.Identity.ID
	}
	for _, ref := range cep.OwnerReferences {
		if ref.Kind == "Pod" {
			c.PodUID = ref.UID
			break
		}
	}
	if cep.Status.Networking != nil {
		c.Networking = cep.Status.Networking.DeepCopy()
	}
	if cep.Status.NamedPorts != nil {
		c.NamedPorts = cep.Status.NamedPorts.DeepCopy()
	}
	return c
}

// CiliumEndpoint rebuilds the CiliumEndpoint of namespace ns that c was
// taken from, as far as a slice knows it: name, namespace, the pod owner
// reference (without the pod's name, which the slice does not keep),
// status.identity (absent when c has none), networking, encryption, named
// ports and service account. It has no UID, resourceVersion or labels.
func (c *CoreCiliumEndpoint) CiliumEndpoint(ns string) *v2.CiliumEndpoint {
	cep := &v2.CiliumEndpoint{
		TypeMeta:   metav1.TypeMeta{APIVersion: v2.SchemeGroupVersion.String(), Kind: "CiliumEndpoint"},
		ObjectMeta: metav1.ObjectMeta{Name: c.Name, Namespace: ns},
		Status: v2.EndpointStatus{
			Encryption: c.Encryption, ServiceAccount: c.ServiceAccount,
		},
	}
	if c.PodUID != "" {
		cep.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", UID: c.PodUID}}
	}
	if c.IdentityID != 0 {
		cep.Status.Identity = &v2.EndpointIdentity{ID: c.IdentityID}
	}
	if c.Networking != nil {
		cep.Status.Networking = c.Networking.DeepCopy()
	}
	if c.NamedPorts != nil {
		cep.Status.NamedPorts = c.NamedPorts.DeepCopy()
	}
	return cep
}
