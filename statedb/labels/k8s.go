package labels

import "strings"

// Well-known label keys (all used with SourceK8s).
const (
	// CiliumK8sPrefix starts every key the agent derives itself. Pod labels
	// with keys that start with it are dropped by FromK8sPod, so a pod cannot
	// claim another namespace, service account or cluster.
	CiliumK8sPrefix = "io.cilium.k8s"

	// PodNamespaceLabel holds the pod's namespace name.
	PodNamespaceLabel = "io.kubernetes.pod.namespace"
	// PodNameLabel holds the pod's name (informational, never part of an
	// identity under the default filter).
	PodNameLabel = "io.kubernetes.pod.name"
	// PodNamespaceMetaLabels prefixes the copies of the namespace's labels:
	// namespace label K=V becomes PodNamespaceMetaLabels + "." + K = V.
	PodNamespaceMetaLabels = "io.cilium.k8s.namespace.labels"
	// PodNamespaceMetaNameLabel is the copy of the namespace label
	// kubernetes.io/metadata.name that Kubernetes puts on every namespace.
	PodNamespaceMetaNameLabel = PodNamespaceMetaLabels + "." + "kubernetes.io/metadata.name"
	// PolicyLabelServiceAccount holds the pod's service account name.
	PolicyLabelServiceAccount = "io.cilium.k8s.policy.serviceaccount"
	// PolicyLabelCluster holds the name of the cluster the pod runs in.
	PolicyLabelCluster = "io.cilium.k8s.policy.cluster"
	// PolicyLabelName, PolicyLabelUID, PolicyLabelNamespace and
	// PolicyLabelDerivedFrom label the rules derived from a Kubernetes
	// policy object with that object's name, UID, namespace and kind.
	PolicyLabelName        = "io.cilium.k8s.policy.name"
	PolicyLabelUID         = "io.cilium.k8s.policy.uid"
	PolicyLabelNamespace   = "io.cilium.k8s.policy.namespace"
	PolicyLabelDerivedFrom = "io.cilium.k8s.policy.derived-from"
	// AppKubernetesPrefix starts the recommended application labels
	// (app.kubernetes.io/name, ...), which the default filter keeps.
	AppKubernetesPrefix = "app.kubernetes.io"
	// FixedIdentityLabel asks for a fixed, user-reserved identity by name.
	FixedIdentityLabel = "io.cilium.fixed-identity"

	// DefaultClusterName is the cluster name used when none is configured.
	DefaultClusterName = "default"
)

// FromK8sPod returns the labels of a pod as the agent derives them from
// Kubernetes, all with source "k8s":
//
//  1. every pod label, except those whose key starts with CiliumK8sPrefix;
//  2. every namespace label K=V as "io.cilium.k8s.namespace.labels.K=V";
//  3. "io.kubernetes.pod.namespace=<namespace>";
//  4. "io.cilium.k8s.policy.serviceaccount=<serviceAccount>", unless
//     serviceAccount is empty;
//  5. "io.cilium.k8s.policy.cluster=<clusterName>", with DefaultClusterName
//     when clusterName is empty.
//
// Pod label keys are read like FromMap reads them with a source: a
// "reserved." prefix of a key is dropped ("reserved.x=y" becomes "k8s:x=y").
//
// The result holds every label, relevant or not; pass it to Filter.Split to
// get the identity labels.
func FromK8sPod(podLabels map[string]string, namespace string, nsLabels map[string]string, serviceAccount, clusterName string) Labels {
	m := make(map[string]string, len(podLabels)+len(nsLabels)+3)
	for k, v := range podLabels {
		if !strings.HasPrefix(k, CiliumK8sPrefix) {
			m[k] = v
		}
	}
	for k, v := range nsLabels {
		m[PodNamespaceMetaLabels+"."+k] = v
	}
	m[PodNamespaceLabel] = namespace
	if serviceAccount != "" {
		m[PolicyLabelServiceAccount] = serviceAccount
	}
	if clusterName == "" {
		clusterName = DefaultClusterName
	}
	m[PolicyLabelCluster] = clusterName
	return FromMap(m, SourceK8s)
}
