// Package endpointpolicy is the agent cell around the policy engine
// (package cells/policy): it feeds the engine from the NetworkPolicy,
// CNP, CCNP, CiliumIdentity, endpoints and pods tables, writes each local
// endpoint's computed policy into the endpoint-policies table (marking a
// row pending first when a repository change affects it, so that the
// endpoint shows waiting-to-regenerate) and the rules' prefixes into the
// policy-cidr-identities table, and serves the /v1/policy API. The
// engine and parser stay free of agent-only dependencies, so the operator
// can validate policies with them.
package endpointpolicy
