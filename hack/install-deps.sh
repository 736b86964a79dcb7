#!/usr/bin/env bash
# Installs what cellium's build and tests need, idempotently: Debian
# packages (iproute2 for network namespaces; clang-19, llvm-19 for
# llvm-strip-19, bpftool; iperf3, sockperf and nsenter for `make bench-datapath`;
# runc, the OCI runtime containerd starts containers with on the real node;
# nftables, for kube-proxy's nftables mode; netcat-openbsd, dnsutils, curl
# and wget, which `make e2e-conformance` copies into the e2e images with
# their libraries: the specs exec nc, dig, curl, wget in their pods;
# prometheus, the server the Hubble dashboard test evaluates every panel's
# PromQL with; chromium, the headless browser the service map's browser
# test drives) when running as root with apt.
# Go modules come from the module proxy through `go` itself.
set -euo pipefail

need=()
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v clang-19 >/dev/null 2>&1 || need+=(clang-19)
command -v llvm-strip-19 >/dev/null 2>&1 || need+=(llvm-19)
command -v bpftool >/dev/null 2>&1 || need+=(bpftool)
command -v iperf3 >/dev/null 2>&1 || need+=(iperf3)
command -v runc >/dev/null 2>&1 || need+=(runc)
command -v nft >/dev/null 2>&1 || need+=(nftables)
command -v sockperf >/dev/null 2>&1 || need+=(sockperf)
command -v nsenter >/dev/null 2>&1 || need+=(util-linux)
command -v nc.openbsd >/dev/null 2>&1 || need+=(netcat-openbsd)
command -v dig >/dev/null 2>&1 || need+=(dnsutils)
command -v curl >/dev/null 2>&1 || need+=(curl)
command -v wget >/dev/null 2>&1 || need+=(wget)
command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 ||
	command -v google-chrome >/dev/null 2>&1 || need+=(chromium)

if [ ${#need[@]} -eq 0 ]; then
	exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
	echo "install-deps: missing ${need[*]}; install them (Debian: apt-get install ${need[*]})" >&2
	echo "install-deps: continuing; tests that need them will skip" >&2
	exit 0
fi
echo "install-deps: installing ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
# Debian's prometheus package enables a server on :9090 for every interface
# where systemd runs; the tests start their own on loopback, so that one is
# stopped and disabled again.
if [[ " ${need[*]} " == *" prometheus "* ]] && command -v systemctl >/dev/null 2>&1 &&
	systemctl is-enabled prometheus >/dev/null 2>&1; then
	echo "install-deps: disabling the prometheus service the package enabled (tests run their own on loopback)"
	systemctl disable --now prometheus >/dev/null 2>&1 || true
fi
