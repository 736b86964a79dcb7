package policy

// Entity is a named class of peers that has no pod labels of its own, such as
// the local host or everything outside the cluster.
//
// +kubebuilder:validation:Enum=all;world;cluster;host;init;ingress;unmanaged;remote-node;health;none;kube-apiserver
type Entity string

// The entities a rule may name. EntityWorldIPv4 and EntityWorldIPv6 are known
// to the rule engine but, as in Cilium, not accepted by the CRD schema.
const (
	EntityAll           Entity = "all"
	EntityWorld         Entity = "world"
	EntityWorldIPv4     Entity = "world-ipv4"
	EntityWorldIPv6     Entity = "world-ipv6"
	EntityCluster       Entity = "cluster"
	EntityHost          Entity = "host"
	EntityInit          Entity = "init"
	EntityIngress       Entity = "ingress"
	EntityUnmanaged     Entity = "unmanaged"
	EntityRemoteNode    Entity = "remote-node"
	EntityHealth        Entity = "health"
	EntityNone          Entity = "none"
	EntityKubeAPIServer Entity = "kube-apiserver"
)

// EntitySlice is a list of entities.
type EntitySlice []Entity
