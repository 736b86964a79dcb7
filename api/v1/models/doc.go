// Package models holds the JSON types of the agent's API (/v1 on the unix
// socket), shared by the agent, the CNI plugin and the CLI, and nothing
// else: every wire type of that API is here. It imports no Kubernetes
// package (test/layout checks it), so that the CNI plugin stays small and
// starts fast. An endpoint's status has the JSON of the CiliumEndpoint's
// .status, so `cellium endpoint get` and the CEP print the same .status;
// the agent converts from the CRD type.
package models
