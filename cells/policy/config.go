package policy

import (
	"github.com/spf13/pflag"
)

// Config is the policy cell's configuration.
type Config struct {
	// EnablePolicy is the enforcement mode: default, always or never.
	EnablePolicy string
}

// DefaultConfig enforces policy where rules select endpoints.
var DefaultConfig = Config{EnablePolicy: string(ModeDefault)}

// Flags registers --enable-policy.
func (def Config) Flags(fs *pflag.FlagSet) {
	fs.String("enable-policy", def.EnablePolicy, "Policy enforcement mode: default (enforce where rules select an endpoint), always, never")
}

// Validate checks --enable-policy.
func (c Config) Validate() error {
	_, err := ParseMode(c.EnablePolicy)
	return err
}

// NewEngineFromConfig returns an engine in the mode --enable-policy says.
//
// Possible errors: an --enable-policy value ParseMode refuses.
func NewEngineFromConfig(c Config) (*Engine, error) {
	m, err := ParseMode(c.EnablePolicy)
	if err != nil {
		return nil, err
	}
	return NewEngine(m), nil
}
