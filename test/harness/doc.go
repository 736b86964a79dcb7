// Package harness runs a real Kubernetes control plane on loopback for cellium's
// integration tests and for the devcluster command: etcd, kube-apiserver and,
// optionally, kube-controller-manager, each a child process built from the tools
// modules in this repository (tools/etcd, tools/k8s).
//
// It owns four things:
//
//   - the binaries: [EnsureBinaries] finds the repository root, reads the pinned
//     versions from tools/k8s/go.mod and tools/etcd/go.mod, and builds whatever
//     is missing from the cache, atomically and under a file lock, so parallel
//     test packages build once;
//   - the cluster: [Start] generates a CA, serving and client certificates and a
//     service-account key, starts the processes on free loopback ports, waits for
//     /readyz and writes an admin kubeconfig; [Cluster.Stop] stops everything and
//     removes the work directory;
//   - the credentials: [Cluster.InstallRBAC] applies the ServiceAccounts and
//     RBAC objects of install/kubernetes/cellium.yaml (the Helm chart's), and
//     [Cluster.AgentKubeconfig] and [Cluster.OperatorKubeconfig] write
//     kubeconfigs with those ServiceAccounts' tokens: the daemons never run
//     as system:masters, so a permission missing from the chart fails a test.
//     [EnsureHelm] builds helm (tools/helm) for the chart's tests;
//   - the processes: [Process] describes one program (argv, env, log file, pid
//     file). Every component is run through it, so more programs (cellium-operator,
//     cellium-agent, a dev kubelet) can be started the same way.
//
// # Using it from a test
//
// One cluster per test:
//
//	func TestSomething(t *testing.T) {
//		c := harness.ForTest(t, harness.Options{})
//		ns := c.TestNamespace(t) // unique namespace with a "default" ServiceAccount
//		_, err := c.Clientset().CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
//		...
//	}
//
// One cluster shared by all tests of a package (start-up costs a few seconds, so
// share it when the tests can live side by side in separate namespaces):
//
//	var cluster = harness.NewShared(harness.Options{})
//
//	func TestMain(m *testing.M) {
//		code := m.Run()
//		if err := cluster.Stop(); err != nil {
//			fmt.Fprintln(os.Stderr, err)
//		}
//		os.Exit(code)
//	}
//
//	func TestA(t *testing.T) {
//		c := cluster.Get(t) // started on first use only
//		ns := c.TestNamespace(t)
//		...
//	}
//
// # ServiceAccounts without the controller-manager
//
// The ServiceAccount admission plugin stays enabled, as in a real cluster, so a
// pod is rejected until its namespace has the "default" ServiceAccount. With
// [Options.ControllerManager] the controller-manager creates it (shortly after the
// namespace). Without it, the harness creates it in the "default" namespace at
// start-up; for other namespaces call [Cluster.EnsureServiceAccount] or use
// [Cluster.TestNamespace], which does it for you. Without the controller-manager
// there is also no garbage collection and no namespace finalization: deleted
// namespaces stay Terminating. Tests of cellium's own garbage collection rely on
// exactly that.
//
// # Binaries and time-outs
//
// Building kube-apiserver and kube-controller-manager takes 10 minutes or more on
// a small machine the first time, longer than go test's default -timeout. Build
// them once beforehand with
//
//	go run ./test/cmd/devcluster build
//
// (or run go test with -timeout 30m). [ForTest] fails at once with this advice
// when the binaries are missing and the test's deadline is too close. The cache is
// $CELLIUM_CACHE_DIR, else $XDG_CACHE_HOME/cellium, else ~/.cache/cellium:
//
//	bin/k8s-v1.37.2/kube-apiserver
//	bin/k8s-v1.37.2/kube-controller-manager
//	bin/k8s-v1.37.2/.recipe        how they were built; a change rebuilds them
//	bin/etcd-v3.6.16/etcd
//	bin/etcd-v3.6.16/.recipe
//	bin/.k8s-v1.37.2.lock          flock held while building
//	bin/.etcd-v3.6.16.lock
//
// The versions come from tools/k8s/go.mod and tools/etcd/go.mod; the Kubernetes
// version is stamped into the binaries (-ldflags -X, as Kubernetes' own build
// does), so the API server reports it at /version.
package harness
