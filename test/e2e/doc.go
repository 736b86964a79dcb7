// Package e2e holds cellium's end-to-end tests: the real cellium-operator,
// cellium-agent and cellium-cni binaries, built from the checkout, against
// a real kube-apiserver and etcd (test/harness), with pods run by the
// devkubelet (test/devkubelet) through libcni, network namespaces and
// veths on this machine.
//
// The tests need root; without it they skip, and with
// CELLIUM_REQUIRE_PRIVILEGED=1 they fail instead. Each test runs its own
// operator and node (agent and kubelet, state in a directory under /tmp)
// and removes every namespace, veth and process it made, on failure too;
// on failure it keeps the directory with the logs and prints their last
// lines.
package e2e
