package metrics

import (
	"time"

	"github.com/cellium/cellium/cells/hive"
)

// WithForgetTiming makes the cell forget deleted pods' series grace after
// their deletion, checking every every.
func WithForgetTiming(grace, every time.Duration) hive.Cell {
	return hive.Provide(func() *forgetTiming { return &forgetTiming{grace: grace, every: every} })
}
