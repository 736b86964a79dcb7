package bpf_test

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/cellium/cellium/datapath/bpf"
	"github.com/cellium/cellium/datapath/loader"
	"github.com/cellium/cellium/datapath/maps"
)

// agentEnv carries the arguments of a stand-in agent into the
// re-executed test binary: "<bpf root> <netns path> <node IP> <port>
// <backend ID>".
const agentEnv = "CELLIUM_BPF_TEST_AGENT"

// runAgent is the stand-in agent of TestPrivilegedNodePortAgentGone: it
// writes a Cluster TCP frontend node IP:port with one backend into the
// pinned lb4 maps under the bpf root, attaches cil_from_netdev to eth0 of
// the namespace with the loader (a pinned tcx link), closes every object
// it opened, prints "ready" and waits to be killed.
func runAgent(args string) int {
	f := strings.Fields(args)
	if len(f) != 5 {
		fmt.Fprintln(os.Stderr, "agent: want <root> <netns> <node IP> <port> <backend ID>")
		return 2
	}
	port, err1 := strconv.ParseUint(f[3], 10, 16)
	backend, err2 := strconv.ParseUint(f[4], 10, 32)
	ip := [4]byte{}
	_, err3 := fmt.Sscanf(f[2], "%d.%d.%d.%d", &ip[0], &ip[1], &ip[2], &ip[3])
	if err1 != nil || err2 != nil || err3 != nil {
		fmt.Fprintln(os.Stderr, "agent: bad arguments", args)
		return 2
	}
	layout := loader.Layout{Root: f[0]}
	svc, err := ebpf.LoadPinnedMap(filepath.Join(layout.Dir(), maps.LB4ServicesMapName), nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "agent:", err)
		return 1
	}
	key := func(slot uint16) bpf.SockLb4Key {
		return bpf.SockLb4Key{Address: binary.LittleEndian.Uint32(ip[:]), Dport: htons(uint16(port)), Proto: syscall.IPPROTO_TCP, Scope: scopeExt, Slot: slot}
	}
	err = svc.Put(key(0), bpf.SockLb4Service{Count: 1, Flags: svcNodePort, BackendId: 60})
	if err == nil {
		err = svc.Put(key(1), bpf.SockLb4Service{BackendId: uint32(backend)})
	}
	svc.Close()
	if err == nil {
		err = (&loader.NodePort{Layout: layout, Netns: loader.Netns{Path: f[1]}}).Ensure([]string{"eth0"})
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "agent:", err)
		return 1
	}
	fmt.Println("ready")
	select {}
}

// TestPrivilegedNodePortAgentGone: the agent is gone, its maps and links
// pinned. A stand-in agent process (the test binary re-executed) writes a
// NodePort frontend (Cluster, the remote backend on node 2) into node 1's
// pinned maps and attaches cil_from_netdev with the loader; a client
// connects through it; then the process is killed (SIGKILL: no cleanup).
// The established connection keeps echoing and new connections are made,
// their NAT entries written into the pinned maps: nothing of the
// replacement lives in the agent's process. (This test process itself
// never loads or attaches the uplink program; it keeps handles of node
// 1's maps, as its topology does, which changes nothing for the
// program.)
func TestPrivilegedNodePortAgentGone(t *testing.T) {
	tp := newNPTopology(t, false)
	// The topology attached the program from this process: take it
	// away, the stand-in agent attaches its own.
	np := &loader.NodePort{Layout: loader.Layout{Root: tp.n1.root}, Netns: loader.Netns{Path: tp.n1.ns.Path()}}
	if err := np.Remove(); err != nil {
		t.Fatal(err)
	}
	const port = 30130
	if _, err := tp.dialFrom(outsideIP, port, time.Second); err == nil {
		t.Fatal("the frontend answers before the agent wrote it")
	}

	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	agent := exec.Command(exe, "-test.run=^$")
	agent.Env = append(os.Environ(), fmt.Sprintf("%s=%s %s %s %d %d", agentEnv, tp.n1.root, tp.n1.ns.Path(), tp.n1.ip, port, 2))
	agent.Stderr = os.Stderr
	out, err := agent.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	kill := func() {
		if !killed {
			killed = true
			_ = agent.Process.Kill()
			_ = agent.Wait()
		}
	}
	t.Cleanup(kill)
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "ready" {
		t.Fatalf("agent: %q, %v", line, err)
	}

	est, seen, err := tp.dialConn(outsideIP, port, 3*time.Second)
	if err != nil {
		t.Fatalf("connection while the agent runs: %v", err)
	}
	defer est.Close()
	if seen != tp.n1.ip.String()+"\n" {
		t.Errorf("backend saw %q, want node 1 (SNAT)", seen)
	}
	kill()
	t.Logf("agent (pid %d) killed: %v", agent.Process.Pid, agent.ProcessState)

	if err := roundTrip(est, "established"); err != nil {
		t.Errorf("the established connection after the agent died: %v", err)
	}
	for i := range 5 {
		c, _, err := tp.dialConn(outsideIP, port, 3*time.Second)
		if err != nil {
			t.Errorf("new connection %d after the agent died: %v", i, err)
			continue
		}
		if err := roundTrip(c, "new"); err != nil {
			t.Errorf("new connection %d: %v", i, err)
		}
		_ = natOf(t, tp.n1.m, port, uint16(localPortOf(c)))
		c.Close()
	}
	if _, err := os.Stat(filepath.Join(np.Layout.NodePortDir(), "eth0")); err != nil {
		t.Errorf("the link pin: %v", err)
	}
	// Clean up what the agent left: its link pin.
	if err := np.Remove(); err != nil {
		t.Error(err)
	}
}
