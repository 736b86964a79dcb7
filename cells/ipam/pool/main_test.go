package pool

import (
	"testing"

	"go.uber.org/goleak"
)

// The concurrency tests start goroutines; none may outlive them.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
