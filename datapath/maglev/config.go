package maglev

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/spf13/pflag"
)

// Load-balancing algorithms (--bpf-lb-algorithm, Cilium's values).
const (
	AlgorithmRandom = "random"
	AlgorithmMaglev = "maglev"
)

// Flag names and defaults (Cilium's).
const (
	AlgorithmFlag = "bpf-lb-algorithm"
	TableSizeFlag = "bpf-lb-maglev-table-size"
	HashSeedFlag  = "bpf-lb-maglev-hash-seed"
	// DefaultTableSize is M, the slots of a frontend's table.
	DefaultTableSize = 16381
	// DefaultHashSeed is Cilium's default seed: 12 bytes, base64.
	DefaultHashSeed = "JLfvgnHc2kaSUFaI"
)

// TableSizes returns the table sizes --bpf-lb-maglev-table-size accepts
// (Cilium's list: primes, each about twice the one before).
func TableSizes() []uint32 {
	return []uint32{251, 509, 1021, 2039, 4093, 8191, 16381, 32749, 65521, 131071}
}

// ErrTableSize means a table size is not one of TableSizes.
var ErrTableSize = errors.New("unsupported Maglev table size")

// ValidTableSize returns an error wrapping ErrTableSize unless m is one of
// TableSizes.
func ValidTableSize(m uint32) error {
	if !slices.Contains(TableSizes(), m) {
		return fmt.Errorf("--%s=%d: %w: use one of %v (a prime well above 100 times the backends of the largest Service)",
			TableSizeFlag, m, ErrTableSize, TableSizes())
	}
	return nil
}

// Seed is the cluster-wide hash seed: 12 bytes.
type Seed [12]byte

// ParseSeed decodes --bpf-lb-maglev-hash-seed: 12 bytes in standard
// base64 (16 characters).
func ParseSeed(s string) (Seed, error) {
	var out Seed
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return out, fmt.Errorf("--%s=%q is not base64: %w", HashSeedFlag, s, err)
	}
	if len(b) != len(out) {
		return out, fmt.Errorf("--%s=%q is %d bytes, want 12 (e.g. head -c12 /dev/urandom | base64)", HashSeedFlag, s, len(b))
	}
	copy(out[:], b)
	return out, nil
}

// Datapath returns the 32-bit seed of bpf/nodeport.c's hash of a
// connection's 5-tuple: the seed's bytes 4-7 (the first four seed the
// backends' permutations).
func (s Seed) Datapath() uint32 { return binary.BigEndian.Uint32(s[4:8]) }

// Config is the backend selection of the kube-proxy replacement for
// traffic from outside the node (bpf/nodeport.c). The socket load
// balancer always picks at random.
type Config struct {
	// Algorithm is AlgorithmRandom or AlgorithmMaglev.
	Algorithm string `flag:"bpf-lb-algorithm"`
	// TableSize is M, the slots of each frontend's Maglev table.
	TableSize uint32 `flag:"bpf-lb-maglev-table-size"`
	// HashSeed is the base64 seed of the hashes, the same on every node.
	HashSeed string `flag:"bpf-lb-maglev-hash-seed"`
}

// DefaultConfig is Cilium's: random, M 16381, Cilium's seed.
var DefaultConfig = Config{Algorithm: AlgorithmRandom, TableSize: DefaultTableSize, HashSeed: DefaultHashSeed}

// Flags registers --bpf-lb-algorithm, --bpf-lb-maglev-table-size and
// --bpf-lb-maglev-hash-seed.
func (def Config) Flags(fs *pflag.FlagSet) {
	fs.String(AlgorithmFlag, def.Algorithm,
		"Backend selection of the kube-proxy replacement for traffic from outside the node (NodePort, LoadBalancer, externalIPs, hostPorts): \"random\", or \"maglev\" (consistent hashing of the connection's 5-tuple, the same backend on every node); the socket load balancer always picks at random")
	fs.Uint32(TableSizeFlag, def.TableSize,
		fmt.Sprintf("Maglev table size M per frontend (one of %v); each table costs M*4 bytes of kernel memory", TableSizes()))
	fs.String(HashSeedFlag, def.HashSeed,
		"Maglev hash seed, 12 bytes in base64, the same on every node of the cluster")
}

// Validate implements hive.Validator.
func (c Config) Validate() error {
	switch c.Algorithm {
	case AlgorithmRandom, AlgorithmMaglev:
	default:
		return fmt.Errorf("--%s=%q: want %q or %q", AlgorithmFlag, c.Algorithm, AlgorithmRandom, AlgorithmMaglev)
	}
	if err := ValidTableSize(c.TableSize); err != nil {
		return err
	}
	_, err := ParseSeed(c.HashSeed)
	return err
}

// Maglev reports whether the algorithm is Maglev.
func (c Config) Maglev() bool { return c.Algorithm == AlgorithmMaglev }

// Seed returns the decoded hash seed (the zero seed when invalid:
// Validate first).
func (c Config) Seed() Seed {
	s, _ := ParseSeed(c.HashSeed)
	return s
}
