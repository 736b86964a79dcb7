package endpointmanager

import (
	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/v1/models"
)

// statusModel converts an endpoint status from the CRD type to the API's
// wire type, which has the same JSON (models is kept free of Kubernetes
// imports for the CNI plugin's sake). TestStatusModel checks that the
// two marshal the same, field for field.
func statusModel(st ciliumv2.EndpointStatus) models.EndpointStatus {
	out := models.EndpointStatus{
		ID:             st.ID,
		Encryption:     models.EncryptionSpec{Key: st.Encryption.Key},
		State:          models.EndpointState(st.State),
		ServiceAccount: st.ServiceAccount,
	}
	if st.Controllers != nil {
		out.Controllers = make(models.ControllerList, len(st.Controllers))
		for i, c := range st.Controllers {
			out.Controllers[i] = models.ControllerStatus{Name: c.Name, UUID: c.UUID}
			if c.Configuration != nil {
				out.Controllers[i].Configuration = &models.ControllerConfiguration{
					ErrorRetry: c.Configuration.ErrorRetry, ErrorRetryBase: c.Configuration.ErrorRetryBase,
					Interval: c.Configuration.Interval,
				}
			}
			if s := c.Status; s != nil {
				out.Controllers[i].Status = &models.ControllerStatusStatus{
					ConsecutiveFailureCount: s.ConsecutiveFailureCount, FailureCount: s.FailureCount,
					LastFailureMsg: s.LastFailureMsg, LastFailureTimestamp: s.LastFailureTimestamp,
					LastSuccessTimestamp: s.LastSuccessTimestamp, SuccessCount: s.SuccessCount,
				}
			}
		}
	}
	if x := st.ExternalIdentifiers; x != nil {
		out.ExternalIdentifiers = &models.EndpointIdentifiers{
			CNIAttachmentID: x.CNIAttachmentID, ContainerID: x.ContainerID, ContainerName: x.ContainerName,
			DockerEndpointID: x.DockerEndpointID, DockerNetworkID: x.DockerNetworkID, PodName: x.PodName,
		}
	}
	if h := st.Health; h != nil {
		out.Health = &models.EndpointHealth{
			Bpf: models.EndpointHealthStatus(h.Bpf), Connected: h.Connected,
			OverallHealth: models.EndpointHealthStatus(h.OverallHealth), Policy: models.EndpointHealthStatus(h.Policy),
		}
	}
	if id := st.Identity; id != nil {
		out.Identity = &models.EndpointIdentity{ID: id.ID, Labels: id.Labels}
	}
	if st.Log != nil {
		out.Log = make([]*models.EndpointStatusChange, len(st.Log))
		for i, l := range st.Log {
			if l != nil {
				out.Log[i] = &models.EndpointStatusChange{Code: l.Code, Message: l.Message, State: l.State, Timestamp: l.Timestamp}
			}
		}
	}
	if n := st.Networking; n != nil {
		out.Networking = &models.EndpointNetworking{NodeIP: n.NodeIP}
		if n.Addressing != nil {
			out.Networking.Addressing = make(models.AddressPairList, len(n.Addressing))
			for i, a := range n.Addressing {
				if a != nil {
					out.Networking.Addressing[i] = &models.AddressPair{IPV4: a.IPV4, IPV6: a.IPV6}
				}
			}
		}
	}
	if p := st.Policy; p != nil {
		out.Policy = &models.EndpointPolicy{Ingress: policyDirection(p.Ingress), Egress: policyDirection(p.Egress)}
	}
	if st.NamedPorts != nil {
		out.NamedPorts = make(models.NamedPorts, len(st.NamedPorts))
		for i, p := range st.NamedPorts {
			if p != nil {
				out.NamedPorts[i] = &models.Port{Name: p.Name, Port: p.Port, Protocol: p.Protocol}
			}
		}
	}
	return out
}

func policyDirection(d *ciliumv2.EndpointPolicyDirection) *models.EndpointPolicyDirection {
	if d == nil {
		return nil
	}
	return &models.EndpointPolicyDirection{
		Enforcing: d.Enforcing,
		Allowed:   models.AllowedIdentityList(identityTuples(d.Allowed)),
		Denied:    models.DenyIdentityList(identityTuples(d.Denied)),
		Removing:  models.AllowedIdentityList(identityTuples(d.Removing)),
		Adding:    models.AllowedIdentityList(identityTuples(d.Adding)),
		State:     models.EndpointPolicyState(d.State),
	}
}

func identityTuples(in []ciliumv2.IdentityTuple) []models.IdentityTuple {
	if in == nil {
		return nil
	}
	out := make([]models.IdentityTuple, len(in))
	for i, t := range in {
		out[i] = models.IdentityTuple(t)
	}
	return out
}
