package pprof_test

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"go.uber.org/goleak"

	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/pprof"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// freePort is a loopback port nobody listens on now.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
}

// getHeap fetches /debug/pprof/heap and checks it is a gzipped profile.
func getHeap(t *testing.T, addr string) {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get("http://" + addr + "/debug/pprof/heap")
	if err != nil {
		t.Fatalf("GET /debug/pprof/heap: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	c.CloseIdleConnections()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /debug/pprof/heap: %s", resp.Status)
	}
	// A protobuf profile, gzipped: what `go tool pprof` reads.
	if !bytes.HasPrefix(body, []byte{0x1f, 0x8b}) {
		t.Fatalf("heap profile is not gzipped (%d bytes): %q", len(body), body[:min(len(body), 64)])
	}
}

func refused(t *testing.T, addr string) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err == nil {
		conn.Close()
		t.Fatalf("something listens on %s with profiling off", addr)
	}
}

func TestAgentServesHeapProfileWhenOn(t *testing.T) {
	port := freePort(t)
	h := hivetest.New(t, []string{"--pprof", "--pprof-address=127.0.0.1", "--pprof-port=" + port}, pprof.AgentCell)
	if err := h.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	getHeap(t, "127.0.0.1:"+port)
	if err := h.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
	// The stop hook closed the listener.
	refused(t, "127.0.0.1:"+port)
}

func TestAgentListensNowhereWhenOff(t *testing.T) {
	port := freePort(t)
	hivetest.Start(t, []string{"--pprof-address=127.0.0.1", "--pprof-port=" + port}, pprof.AgentCell)
	refused(t, "127.0.0.1:"+port)
}

func TestOperatorServesHeapProfileWhenOn(t *testing.T) {
	port := freePort(t)
	hivetest.Start(t, []string{"--operator-pprof", "--operator-pprof-address=127.0.0.1", "--operator-pprof-port=" + port}, pprof.OperatorCell)
	getHeap(t, "127.0.0.1:"+port)
}

func TestOperatorListensNowhereWhenOff(t *testing.T) {
	port := freePort(t)
	hivetest.Start(t, []string{"--operator-pprof-address=127.0.0.1", "--operator-pprof-port=" + port}, pprof.OperatorCell)
	refused(t, "127.0.0.1:"+port)
}

// The flags and their defaults are Cilium's.
func TestFlagsAreCiliums(t *testing.T) {
	for _, c := range []struct {
		flags interface{ Flags(*pflag.FlagSet) }
		want  map[string]string
	}{
		{pprof.DefaultAgentConfig, map[string]string{"pprof": "false", "pprof-address": "localhost", "pprof-port": "6060"}},
		{pprof.DefaultOperatorConfig, map[string]string{"operator-pprof": "false", "operator-pprof-address": "localhost", "operator-pprof-port": "6061"}},
	} {
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		c.flags.Flags(fs)
		n := 0
		fs.VisitAll(func(*pflag.Flag) { n++ })
		if n != len(c.want) {
			t.Errorf("%T registers %d flags, want %d", c.flags, n, len(c.want))
		}
		for name, def := range c.want {
			f := fs.Lookup(name)
			if f == nil {
				t.Errorf("no --%s", name)
				continue
			}
			if f.DefValue != def {
				t.Errorf("--%s default %q, want %q", name, f.DefValue, def)
			}
		}
	}
}

// An address that cannot be listened on stops the start, naming the flags.
func TestBadAddressNamesFlags(t *testing.T) {
	h := hivetest.New(t, []string{"--pprof", "--pprof-address=256.0.0.1"}, pprof.AgentCell)
	err := h.Start(t.Context())
	if err == nil {
		_ = h.Stop(t.Context())
		t.Fatal("started with an invalid address")
	}
	if !strings.Contains(err.Error(), "--pprof-address") {
		t.Fatalf("err = %v, want it to name the flag", err)
	}
}
