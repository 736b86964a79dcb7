package e2enetpol

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cellium/cellium/test/ociimage"
)

// Tool is a program of this machine that an image gets, at Path, with the
// shared libraries it loads.
type Tool struct {
	// Path is where the image has it, e.g. "/usr/bin/nc".
	Path string
	// Host is the program on this machine's $PATH, e.g. "nc.openbsd".
	Host string
	// Package is the Debian package that installs Host (hack/install-deps.sh).
	Package string
}

// ConformanceTools are the programs the sig-network conformance specs run
// in their agnhost and glibc-dns-testing containers, taken from this
// machine (Debian) instead of the upstream images' Alpine and Debian bases:
//
//   - `/bin/sh -c` or `sh -c` around every command (kubectl exec, the DNS
//     probers' loops);
//   - `echo hostName | nc -v -t -w 2 IP PORT` (and -u): Service
//     reachability (framework/service/jig.go), HostPort's UDP check;
//   - `curl -q -s --connect-timeout 2 http://IP:PORT/...`: session
//     affinity, the test container's /dial requests (framework/network),
//     HostPort, ExternalName and NodePort checks;
//   - `dig +notcp|+tcp +noall +answer +search NAME [SRV|PTR|CNAME]` and
//     `getent hosts NAME`, in a `for i in $(seq 1 600)` loop with `test`,
//     `echo` and `sleep`: the DNS probers (network/dns_common.go);
//   - `wget -q -O -` / `wget -T 5 -qO-`: reachability helpers;
//   - cat, grep, tr, awk, sed, head, hostname, dd, ls, timeout: the small
//     commands the framework's shell lines use.
var ConformanceTools = []Tool{
	{Path: "/bin/sh", Host: "dash", Package: "dash"},
	{Path: "/usr/bin/nc", Host: "nc.openbsd", Package: "netcat-openbsd"},
	{Path: "/usr/bin/curl", Host: "curl", Package: "curl"},
	{Path: "/usr/bin/wget", Host: "wget", Package: "wget"},
	{Path: "/usr/bin/dig", Host: "dig", Package: "dnsutils"},
	{Path: "/usr/bin/nslookup", Host: "nslookup", Package: "dnsutils"},
	{Path: "/usr/bin/getent", Host: "getent", Package: "libc-bin"},
	{Path: "/usr/bin/seq", Host: "seq", Package: "coreutils"},
	{Path: "/usr/bin/sleep", Host: "sleep", Package: "coreutils"},
	// The Services specs' slow-terminating pods exec /bin/sleep in their
	// preStop hook and /bin/false as readiness probe (without them the
	// pod dies at once instead of terminating for minutes).
	{Path: "/bin/sleep", Host: "sleep", Package: "coreutils"},
	{Path: "/bin/false", Host: "false", Package: "coreutils"},
	{Path: "/usr/bin/cat", Host: "cat", Package: "coreutils"},
	{Path: "/usr/bin/echo", Host: "echo", Package: "coreutils"},
	{Path: "/usr/bin/test", Host: "test", Package: "coreutils"},
	{Path: "/usr/bin/tr", Host: "tr", Package: "coreutils"},
	{Path: "/usr/bin/head", Host: "head", Package: "coreutils"},
	{Path: "/usr/bin/dd", Host: "dd", Package: "coreutils"},
	{Path: "/usr/bin/ls", Host: "ls", Package: "coreutils"},
	{Path: "/usr/bin/timeout", Host: "timeout", Package: "coreutils"},
	{Path: "/usr/bin/grep", Host: "grep", Package: "grep"},
	{Path: "/usr/bin/sed", Host: "sed", Package: "sed"},
	{Path: "/usr/bin/awk", Host: "mawk", Package: "mawk"},
	{Path: "/usr/bin/hostname", Host: "hostname", Package: "hostname"},
}

// nsswitch makes getent (and every glibc lookup) read /etc/hosts, then
// ask the resolv.conf's server, as the upstream images do.
const nsswitch = "passwd: files\ngroup: files\nhosts: files dns\nnetworks: files\nprotocols: files\nservices: files\n"

// ToolFiles returns the image files of tools: each program at its Path and
// every shared library ldd says it loads (and the dynamic loader) at the
// path ldd names, plus /etc/nsswitch.conf. The files are copies of this
// machine's, so the image runs what this machine runs.
//
// Errors: a program is not installed (the error names the Debian packages
// to install: `make deps` does); ldd fails.
func ToolFiles(ctx context.Context, tools []Tool) ([]ociimage.File, error) {
	var files []ociimage.File
	var missing []string
	seen := map[string]bool{}
	add := func(f ociimage.File) {
		if !seen[f.Path] {
			seen[f.Path] = true
			files = append(files, f)
		}
	}
	for _, t := range tools {
		src, err := exec.LookPath(t.Host)
		if err != nil {
			missing = append(missing, t.Package)
			continue
		}
		if src, err = filepath.EvalSymlinks(src); err != nil {
			return nil, fmt.Errorf("tool %s: %w", t.Host, err)
		}
		add(ociimage.File{Path: t.Path, Source: src})
		libs, err := sharedLibraries(ctx, src)
		if err != nil {
			return nil, err
		}
		for _, l := range libs {
			add(ociimage.File{Path: l, Source: l})
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		return nil, fmt.Errorf("the e2e images need programs this machine lacks: install %s (make deps)", strings.Join(slices.Compact(missing), " "))
	}
	add(ociimage.File{Path: "/etc/nsswitch.conf", Data: []byte(nsswitch), Mode: 0o644})
	return files, nil
}

// sharedLibraries returns the absolute paths ldd prints for program: the
// libraries it loads and the dynamic loader; none for a static program.
//
// Errors: ldd cannot run, or fails for another reason than a static
// program.
func sharedLibraries(ctx context.Context, program string) ([]string, error) {
	out, err := exec.CommandContext(ctx, "ldd", program).CombinedOutput()
	if err != nil {
		if bytes.Contains(out, []byte("not a dynamic executable")) {
			return nil, nil
		}
		return nil, fmt.Errorf("ldd %s: %w: %s", program, err, strings.TrimSpace(string(out)))
	}
	return parseLdd(out)
}

// parseLdd reads ldd's output:
//
//	linux-vdso.so.1 (0x00007ffd...)
//	libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f...)
//	/lib64/ld-linux-x86-64.so.2 (0x00007f...)
//
// Errors: a library is "not found".
func parseLdd(out []byte) ([]string, error) {
	var libs []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.Contains(line, "not found") {
			return nil, fmt.Errorf("ldd: %s", line)
		}
		if _, after, ok := strings.Cut(line, "=> "); ok {
			line = after
		}
		p, _, _ := strings.Cut(line, " ")
		if path.IsAbs(p) {
			libs = append(libs, path.Clean(p))
		}
	}
	return libs, sc.Err()
}
