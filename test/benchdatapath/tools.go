package benchdatapath

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
)

// inNetns returns a command running name in network namespace n
// (nsenter), killed when ctx ends.
func inNetns(ctx context.Context, n ns.NetNS, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + n.Path(), "--", name}, args...)...)
	cmd.WaitDelay = 2 * time.Second
	return cmd
}

// pinned returns name and args wrapped in `taskset -c cpu` when the
// topology pins the bench's processes (cpu < 0: not pinned).
func pinned(cpu int, name string, args ...string) (string, []string) {
	if cpu < 0 {
		return name, args
	}
	return "taskset", append([]string{"-c", strconv.Itoa(cpu), name}, args...)
}

// server starts a server in n and returns a function stopping it.
func server(ctx context.Context, n ns.NetNS, name string, args ...string) (stop func(), err error) {
	sctx, cancel := context.WithCancel(ctx)
	cmd := inNetns(sctx, n, name, args...)
	if err := cmd.Start(); err != nil {
		cancel()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	return func() { cancel(); _ = cmd.Wait() }, nil
}

// waitListening waits until something listens on TCP port in n.
func waitListening(ctx context.Context, n ns.NetNS, port int) error {
	want := fmt.Sprintf(":%d ", port)
	for {
		out, err := inNetns(ctx, n, "ss", "-Hltn").Output()
		if err != nil {
			return fmt.Errorf("ss: %w", err)
		}
		for _, l := range strings.Split(string(out), "\n") {
			if strings.Contains(l, want) {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// iperf3 runs one TCP stream from pod a to pod b for d and returns the
// received throughput in bits per second.
func (t *topology) iperf3(ctx context.Context, d time.Duration) (float64, error) {
	name, args := pinned(t.serverCPU, "iperf3", "-s", "-1", "-B", t.b.ip.String(), "-p", strconv.Itoa(iperfPort))
	stop, err := server(ctx, t.b.ns, name, args...)
	if err != nil {
		return 0, err
	}
	defer stop()
	if err := waitListening(ctx, t.b.ns, iperfPort); err != nil {
		return 0, err
	}
	name, args = pinned(t.clientCPU, "iperf3", "-c", t.b.ip.String(), "-p", strconv.Itoa(iperfPort),
		"-t", strconv.Itoa(int(d.Seconds())), "-J")
	out, err := inNetns(ctx, t.a.ns, name, args...).Output()
	if err != nil {
		return 0, fmt.Errorf("iperf3 client: %w: %s", err, out)
	}
	return ParseIperf3(out)
}

// ParseIperf3 returns the received throughput (bits/s) of iperf3 -J's
// output.
func ParseIperf3(out []byte) (float64, error) {
	var res struct {
		End struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
		Error string `json:"error"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		return 0, fmt.Errorf("parse iperf3 output: %w", err)
	}
	if res.Error != "" {
		return 0, fmt.Errorf("iperf3: %s", res.Error)
	}
	if res.End.SumReceived.BitsPerSecond <= 0 {
		return 0, errors.New("iperf3 output has no received throughput")
	}
	return res.End.SumReceived.BitsPerSecond, nil
}

var sockperfValid = regexp.MustCompile(`\[Valid Duration\] RunTime=([0-9.]+) sec; SentMessages=(\d+); ReceivedMessages=(\d+)`)

// sockperf runs a TCP ping-pong (one request in flight, 64 bytes) from
// pod a to pod b for d and returns transactions per second.
func (t *topology) sockperf(ctx context.Context, d time.Duration) (float64, error) {
	name, args := pinned(t.serverCPU, "sockperf", "sr", "--tcp", "-i", t.b.ip.String(), "-p", strconv.Itoa(sockperfPort))
	stop, err := server(ctx, t.b.ns, name, args...)
	if err != nil {
		return 0, err
	}
	defer stop()
	if err := waitListening(ctx, t.b.ns, sockperfPort); err != nil {
		return 0, err
	}
	name, args = pinned(t.clientCPU, "sockperf", "pp", "--tcp", "-i", t.b.ip.String(), "-p", strconv.Itoa(sockperfPort),
		"-m", "64", "-t", strconv.Itoa(int(d.Seconds())))
	out, err := inNetns(ctx, t.a.ns, name, args...).CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("sockperf client: %w: %s", err, out)
	}
	return parseSockperf(out)
}

// parseSockperf returns the round trips per second of sockperf
// ping-pong's output: messages received back over the valid duration.
func parseSockperf(out []byte) (float64, error) {
	m := sockperfValid.FindSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("sockperf output has no valid-duration summary: %s", out)
	}
	secs, _ := strconv.ParseFloat(string(m[1]), 64)
	recv, _ := strconv.ParseFloat(string(m[3]), 64)
	if secs <= 0 || recv <= 0 {
		return 0, fmt.Errorf("sockperf received %v messages in %v s", recv, secs)
	}
	return recv / secs, nil
}

func lookPath(bin string) error {
	if _, err := exec.LookPath(bin); err != nil {
		return fmt.Errorf("%s not found: run `make deps` (Debian packages iperf3, sockperf, util-linux, iproute2)", bin)
	}
	return nil
}
