package endpointpolicy

import (
	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/policy"
	statepolicy "github.com/cellium/cellium/statedb/policy"
)

// Cell computes every local endpoint's policy from the NetworkPolicy,
// CiliumNetworkPolicy, CiliumClusterwideNetworkPolicy and CiliumIdentity
// tables and writes it to the endpoint-policies table.
var Cell = hive.Module("policy", "Computes endpoint policies from network policies",
	// --enable-policy.
	hive.Config(policy.DefaultConfig),
	// The desired endpoint policies: written only here.
	hive.ProvidePrivate(statepolicy.NewTable),
	// Everyone else (CEP sync, the datapath, the API) reads them.
	hive.Provide(statedb.RWTable[*statepolicy.EndpointPolicyRow].ToTable),
	// Prefixes rules use and their local identities, for the datapath's ipcache.
	hive.ProvidePrivate(statepolicy.NewCIDRTable),
	hive.Provide(statedb.RWTable[*statepolicy.CIDRIdentity].ToTable),
	// The engine itself, for the API's policy and selector views.
	hive.Provide(policy.NewEngineFromConfig),
	// The policies the controller refused, shared with the API.
	hive.ProvidePrivate(newRejections),
	// GET /v1/policy, /v1/policy/selectors, /v1/policy/endpoint/{id}, /v1/policy/trace.
	hive.Provide(apiHandlers),
	// Tables in, computed policies out.
	hive.Invoke(registerController),
)
