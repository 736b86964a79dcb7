// Package devkubelet is a minimal kubelet for cellium's local cluster, its
// end-to-end tests and its benchmark: it runs the pods of one node without
// containers, but gives each the network a real node would, through the
// real CNI path.
//
// For each pod bound to its node (spec.nodeName) the [Kubelet]
//
//   - records a sandbox (StateDir/sandboxes/ID.json) with a fresh 64-digit
//     sandbox ID, before making anything;
//   - creates a network namespace pinned at /var/run/netns/NAME, as
//     `ip netns add` does, with its loopback up; NAME is
//     cellium-<namespace>-<pod>-<first 8 digits of the sandbox ID>, so
//     `ip netns exec NAME ...` works on it;
//   - calls CNI ADD through libcni exactly as a container runtime does: the
//     network is the first configuration file in the configuration
//     directory, the plugins come from the binary directories, CNI_ARGS
//     carry IgnoreUnknown=1, K8S_POD_NAMESPACE, K8S_POD_NAME,
//     K8S_POD_INFRA_CONTAINER_ID (the sandbox ID) and K8S_POD_UID, the
//     interface is eth0;
//   - writes the pod's status through the status subresource: Running,
//     podIP/podIPs from the CNI result, hostIP, Ready conditions, running
//     container statuses. A failed ADD is undone with CNI DEL (as runtimes
//     do), reported as a FailedCreatePodSandBox event and retried with
//     backoff.
//
// When a pod is deleted, finishes, is re-created under the same name (new
// UID) or its namespace disappears, the kubelet calls CNI DEL and removes
// the namespace; a terminating pod is then deleted for good (grace period
// 0), which is how a real kubelet confirms that its containers are gone.
// A DEL that fails (the agent is down: code 11) keeps the sandbox and the
// pod until a retry succeeds.
//
// The node: the Node object is registered with the configured InternalIP
// (a 127.0.0.0/8 address on a single machine: it is reported, never routed
// to) and is Ready only while the CNI configuration directory holds a
// network, as kubelet's NetworkReady; a Lease in kube-node-lease is renewed
// every 10 seconds.
//
// A restarted kubelet with the same StateDir adopts the sandboxes of pods
// that still exist (no CNI call) and tears down the others. Cleanup tears
// down everything and unregisters the node; RemoveLeftovers removes the
// namespaces and veths of a state directory without calling any plugin,
// for when the agent is gone too.
//
// Per pod, the kubelet measures the CNI ADD and DEL latencies and when the
// pod was reported Running ([Kubelet.Timings]); the endpoint benchmark
// reads them.
//
// The kubelet needs root (network namespaces, and the plugins it runs
// create veths). The command is test/cmd/devkubelet; package devnode runs
// it together with cellium-agent and cellium-operator.
package devkubelet
