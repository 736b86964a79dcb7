// Package install holds cellium's installation: the Helm chart
// (install/helm/cellium) and the same objects rendered as plain manifests
// (install/kubernetes/cellium.yaml, `make manifests`) for users without Helm.
// The Go code renders the chart and reads the manifests, so that the tests
// and the test harness use the very objects users install: the harness runs
// the agent and the operator with the credentials of these ServiceAccounts
// and these RBAC rules.
package install
