// Package policyvalidator is the operator cell that validates every
// CiliumNetworkPolicy and CiliumClusterwideNetworkPolicy with the agent's
// own parser (cells/policy) and writes the result into the policy's
// status conditions, as Cilium's operator does: Valid (True, or False
// with the error naming each bad field: agents then reject the whole
// policy) and cellium's Supported (False, reason L7RulesNotEnforced or
// FieldsNotSupported, naming the parts agents parse but do not enforce).
//
// The conditions flow as everywhere else: the policy tables -> the
// desired conditions table (policy-conditions, any replica) -> the
// generic reconciler -> UpdateStatus (the leader only).
package policyvalidator

import (
	"github.com/spf13/pflag"

	"github.com/cellium/cellium/cells/hive"
)

// Cell validates CNPs and CCNPs and writes their status conditions.
var Cell = hive.Module("policy-validator", "Validates CNPs/CCNPs into their status conditions",
	// --validate-network-policy (Cilium's name and default).
	hive.Config(DefaultConfig),
	// The desired conditions, derived from the policy tables.
	hive.ProvidePrivate(NewTable),
	// Derive on every replica; write to the API server on the leader only.
	hive.Provide(register),
)

// Config is the validator's configuration.
type Config struct {
	// ValidateNetworkPolicy turns the validator on.
	ValidateNetworkPolicy bool
}

// DefaultConfig validates, as Cilium's operator does by default.
var DefaultConfig = Config{ValidateNetworkPolicy: true}

// Flags registers --validate-network-policy.
func (def Config) Flags(fs *pflag.FlagSet) {
	fs.Bool("validate-network-policy", def.ValidateNetworkPolicy,
		"Validate CiliumNetworkPolicies and CiliumClusterwideNetworkPolicies and write the result into their status conditions (Valid, Supported)")
}
