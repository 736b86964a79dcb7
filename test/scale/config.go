// Package scale simulates a large cluster around one real cellium agent
// and operator: it starts a real kube-apiserver and etcd (test/harness),
// writes the objects of many other nodes (CiliumNodes, their pods'
// CiliumEndpoints, CiliumIdentities, Services with EndpointSlices,
// NetworkPolicies) with the admin client, churns the pods at a given rate
// and measures what the agent and the API server pay for it: the agent's
// memory per remote endpoint, its CPU per 1,000 remote endpoint changes,
// the latency from a CiliumEndpoint's write (in kvstore mode: its
// ipcache key's) to the agent's ipcache entry,
// the latency from a policy change to the agent's desired policy map
// state, the API server's watch events and cellium's writes per second,
// and etcd's database size. test/cmd/scale (`make scale`) runs it;
// Documentation/operations/scale.md explains the figures.
package scale

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/cellium/cellium/cells/cesbatcher"
)

// Mode is how the agent learns other nodes' endpoints.
type Mode string

// The modes.
const (
	// ModeCEP: the agent watches every CiliumEndpoint.
	ModeCEP Mode = "cep"
	// ModeCES: the agent watches the CiliumEndpointSlices the real
	// operator batches the CiliumEndpoints into
	// (--enable-cilium-endpoint-slice on both), the operator at the Helm
	// chart's default --ces-rate-limits.
	ModeCES Mode = "ces"
	// ModeKVStore: Cilium's etcd kvstore mode
	// (--identity-allocation-mode=kvstore --kvstore=etcd on both, the
	// harness's etcd): the simulation writes what the other nodes'
	// agents write to etcd, each node's keys with its session lease:
	// the identities under cilium/state/identities/v1/ instead of
	// CiliumIdentities, each node's key under cilium/state/nodes/v1/ and
	// each remote pod's ipcache key under cilium/state/ip/v1/default/.
	// The CiliumNodes and CiliumEndpoints are written too, as Cilium's
	// agents write them in kvstore mode (cellium's agent watches them
	// too; the keys win).
	ModeKVStore Mode = "kvstore"
)

// Modes are the modes in the order `-mode all` runs them.
var Modes = []Mode{ModeCEP, ModeCES, ModeKVStore}

// Config is one simulation.
type Config struct {
	// Mode is cep, ces or kvstore.
	Mode Mode
	// Nodes is the number of other nodes (CiliumNodes).
	Nodes int
	// Pods is the number of pods on the other nodes: the agent's remote
	// endpoints (one CiliumEndpoint each).
	Pods int
	// Services is the number of Services, each with one EndpointSlice.
	Services int
	// Policies is the number of NetworkPolicies.
	Policies int
	// Identities is the number of identities (CiliumIdentities, or
	// kvstore keys in kvstore mode); pods share them round-robin.
	Identities int
	// Churn is the rate of remote endpoint changes per second during the
	// churn phase: each pod replacement (a CiliumEndpoint deleted, a new
	// one with a new address created) is two changes.
	Churn float64
	// ChurnDuration is how long the churn phase lasts.
	ChurnDuration time.Duration
	// Samples is how many of the churn's new pods have their CEP-to-
	// ipcache latency measured.
	Samples int
	// PolicyChanges is how many times the measured policy is changed.
	PolicyChanges int
	// Concurrency bounds the admin client's requests in flight while the
	// objects are created.
	Concurrency int
	// BinDir holds cellium-agent and cellium-operator; empty: they are
	// built into a temporary directory.
	BinDir string
	// AgentArgs and OperatorArgs are appended to the daemons' flags (the
	// last occurrence of a flag wins), e.g. `--ces-rate-limits=[{"nodes":0,"limit":50,"burst":100}]`
	// instead of the chart's steps CES mode passes.
	AgentArgs, OperatorArgs []string
	// HeapProfile, if set, is where the agent's heap profile (pprof's
	// protobuf format, taken after a GC through the agent's --pprof
	// server) is saved once every remote object is in, just after the
	// memory sample with all of them; the profile before any remote
	// object, after the first memory sample, is saved beside it with
	// "-before" added to the name (heap.pprof, heap-before.pprof).
	HeapProfile string
	// KeepDir keeps the cluster's work directory (logs) after the run.
	KeepDir bool
	// Log receives progress; nil discards it.
	Log *slog.Logger
}

// CIConfig is the size `make test` runs (TestScale).
func CIConfig(mode Mode) Config {
	return Config{Mode: mode, Nodes: 100, Pods: 2000, Services: 200, Policies: 100, Identities: 1000,
		Churn: 50, ChurnDuration: 10 * time.Second, Samples: 200, PolicyChanges: 5, Concurrency: 32}
}

// withDefaults fills the zero fields that need a value.
func (c Config) withDefaults() Config {
	if c.Mode == "" {
		c.Mode = ModeCEP
	}
	if c.Identities == 0 {
		c.Identities = 1
	}
	if c.Samples == 0 {
		c.Samples = 200
	}
	if c.PolicyChanges == 0 {
		c.PolicyChanges = 5
	}
	if c.Concurrency == 0 {
		c.Concurrency = 32
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate checks the sizes.
func (c Config) Validate() error {
	switch {
	case c.Mode != ModeCEP && c.Mode != ModeCES && c.Mode != ModeKVStore:
		return fmt.Errorf("mode %q: want cep, ces or kvstore", c.Mode)
	case c.Nodes < 1 || c.Nodes > maxNodes:
		return fmt.Errorf("nodes %d: want 1 to %d", c.Nodes, maxNodes)
	case c.Pods < 1 || c.Pods > c.Nodes*200:
		return fmt.Errorf("pods %d: want 1 to %d (200 per node, so that churn finds free addresses)", c.Pods, c.Nodes*200)
	case c.Identities < 1 || c.Identities > maxIdentities:
		return fmt.Errorf("identities %d: want 1 to %d", c.Identities, maxIdentities)
	case c.Services < 0 || c.Policies < 0 || c.Churn < 0 || c.ChurnDuration < 0:
		return fmt.Errorf("services, policies, churn and its duration must not be negative")
	}
	return nil
}

// Setup is the line that says what was simulated.
func (c Config) Setup() string {
	s := fmt.Sprintf("%s mode: 1 agent + 1 operator, %d other nodes, %d remote pods, %d identities, %d Services, %d NetworkPolicies, churn %.0f changes/s for %s",
		c.Mode, c.Nodes, c.Pods, c.Identities, c.Services, c.Policies, c.Churn, c.ChurnDuration)
	switch c.Mode {
	case ModeCES:
		if c.operatorSetsCESRate() {
			s += "; operator's CES write rate as given (-operator-arg)"
		} else {
			// The agent's own CiliumNode counts too.
			st := chartStep(c.Nodes + 1)
			s += fmt.Sprintf("; operator at the Helm chart's default ciliumEndpointSlice.rateLimits (10 slice writes/s and bursts of 20 "+
				"below 100 CiliumNodes, 50/s and 100 from 100 on): %.0f/s and %d here", st.Limit, st.Burst)
		}
	case ModeKVStore:
		s += "; identities, node keys and ipcache keys in etcd (leased), CiliumNodes and CiliumEndpoints written too"
	}
	return s
}

// operatorSetsCESRate reports whether OperatorArgs set the operator's
// slice write rate (--ces-rate-limits, or the deprecated
// --ces-write-qps-limit or --ces-write-qps-burst, which the operator
// refuses beside --ces-rate-limits): then CES mode does not pass the
// chart's steps.
func (c Config) operatorSetsCESRate() bool {
	return slices.ContainsFunc(c.OperatorArgs, func(a string) bool {
		for _, f := range []string{cesbatcher.FlagRateLimits, cesbatcher.FlagWriteQPS, cesbatcher.FlagWriteBurst} {
			if a == "--"+f || strings.HasPrefix(a, "--"+f+"=") {
				return true
			}
		}
		return false
	})
}
