package policy

import (
	"encoding/binary"
	"sync"

	statepolicy "github.com/cellium/cellium/statedb/policy"
)

// maxCachedPolicies bounds the policy cache, and so what it keeps of
// policies no endpoint holds any more; when it is full it starts over.
// Past that many distinct rule combinations sharing is rare anyway.
const maxCachedPolicies = 1024

// policyCache shares computed direction policies between endpoints. The
// policy of an endpoint in one direction is a function of the rules that
// select it (with entries in that direction), the identities their peer
// selectors select, the enforcement mode, the egress named ports and, for
// ingress, the endpoint's own ports of the names those rules use. The key
// (policyCacheKey) holds the rules and the endpoint's ports; the engine
// empties the cache whenever anything else changes (rules, selections,
// egress named ports). So endpoints of one identity, and more generally
// every endpoint the same rules select, compute their policy once.
//
// The cached entries are shared, as EndpointPolicy's contract allows:
// nobody modifies a computed policy.
//
// get and put may run concurrently (Compute holds the engine's read lock);
// flush runs under the engine's write lock.
type policyCache struct {
	mu sync.Mutex
	m  map[string]statepolicy.DirectionPolicy
}

func (c *policyCache) get(key string) (statepolicy.DirectionPolicy, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	dp, ok := c.m[key]
	return dp, ok
}

func (c *policyCache) put(key string, dp statepolicy.DirectionPolicy) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= maxCachedPolicies {
		c.m = make(map[string]statepolicy.DirectionPolicy)
	}
	c.m[key] = dp
}

func (c *policyCache) flush() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.m = nil
}

func (c *policyCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}

// policyCacheKey encodes what the policy of ep in direction d depends on
// besides the engine-wide state: the direction, the rules (those of rules
// with entries in d, by their unique seq) and, for ingress, ep's ports of
// every name those rules use. Every part is length-prefixed, so distinct
// inputs give distinct keys.
func policyCacheKey(ep Endpoint, rules []*compiledRule, d statepolicy.Direction) string {
	b := make([]byte, 0, 2+5*len(rules))
	b = append(b, byte(d))
	n := 0
	for _, cr := range rules {
		if len(cr.rule.entries(d)) > 0 {
			n++
		}
	}
	b = binary.AppendUvarint(b, uint64(n))
	for _, cr := range rules {
		if len(cr.rule.entries(d)) > 0 {
			b = binary.AppendUvarint(b, cr.seq)
		}
	}
	if d != statepolicy.Ingress {
		return string(b)
	}
	for _, cr := range rules {
		if len(cr.rule.Ingress) == 0 {
			continue
		}
		for _, name := range cr.ingressNames {
			b = binary.AppendUvarint(b, uint64(len(name)))
			b = append(b, name...)
			ports := ep.NamedPorts[name]
			b = binary.AppendUvarint(b, uint64(len(ports)))
			for _, p := range ports {
				b = binary.BigEndian.AppendUint16(b, p.Port)
				b = append(b, p.Proto)
			}
		}
	}
	return string(b)
}
