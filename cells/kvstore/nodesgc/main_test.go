package nodesgc

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreAnyFunction("k8s.io/klog/v2.(*loggingT).flushDaemon")); err != nil {
			os.Stderr.WriteString("goroutines left behind: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}
