// Package k8stest holds test helpers for cells that use k8s.Clientset: a
// fake clientset behaving like the API server on resourceVersion and
// preconditions, and helpers to feed statedb resource tables from it. It
// also has the two small helpers those tests share: a hive.Health that
// keeps the last report, and a poll that waits for a condition.
//
// It is imported only by tests.
package k8stest
