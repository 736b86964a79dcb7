// Package policy holds the rule language of CiliumNetworkPolicy and
// CiliumClusterwideNetworkPolicy: the Go form of the objects under a policy's
// `spec` and `specs`.
//
// The types only describe what a user writes. Their JSON encoding (keys,
// omitted fields, enums) matches Cilium's, so an existing policy manifest
// decodes and re-encodes unchanged. Checking a rule for meaning (one selector,
// at least one direction, ...) and turning it into selector-cache entries is
// the job of the policy cell, not of this package.
//
// +kubebuilder:object:generate=true
package policy
