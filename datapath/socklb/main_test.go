package socklb

import (
	"fmt"
	"os"
	"testing"
)

// childEnv makes the test binary a client of the privileged test (see
// runChild) instead of running tests.
const childEnv = "CELLIUM_SOCKLB_TEST_CHILD"

func TestMain(m *testing.M) {
	if args := os.Getenv(childEnv); args != "" {
		if err := runChild(args); err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}
