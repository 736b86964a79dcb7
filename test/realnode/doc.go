// Package realnode runs a real Kubernetes node on this machine against a
// harness cluster (test/harness): containerd v2 with Debian's runc,
// kubelet and kube-scheduler, built from the module proxy and cached like
// the control plane (harness.EnsureNodeBinaries), with cellium as the
// node's CNI: cellium-agent as a process writing its conflist into the
// directory containerd's CRI plugin watches, cellium-cni and the CNI
// loopback plugin in its plugin directory. Images come from OCI archives
// packed locally (test/ociimage) and imported with ctr: no registry.
//
// A node started without an agent binary gets cellium the way users
// install it: [Up] runs a control plane and such a node and [Install]
// applies the Helm chart (the agent's DaemonSet and the operator's
// Deployment, from the packed cellium image, host paths inside the node's
// directory: [DevValues]); `make up` is Up with Detach, `make down` is
// [Down].
//
// Everything of a node lives in one directory (containerd's root, state,
// sockets and network namespaces; the kubelet's root, certificates and pod
// logs; the CNI directories; the logs). What the kubelet insists on
// changing on the host — the sysctls it tunes, its cgroup tree (under a
// cgroup root of its own), the symbolic links in /var/log/containers, and
// the shim directories under /run/containerd — is recorded at start and
// restored or removed by [Node.Stop]; [Leftovers] lists whatever is still
// there.
//
// The machine facts this package works around: cgroup v1 without systemd
// (cgroupfs driver, failCgroupV1: false), no CAP_SYS_RESOURCE for root
// (containerd's restrict_oom_score_adj), no dummy device (the node's IP
// sits on a veth pair of its own, as the kubelet refuses a loopback IP).
package realnode
