package harness

import (
	"context"
	"fmt"
	"log/slog"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// NodeBinaries are the absolute paths of the programs of a real Kubernetes
// node (package test/realnode runs them) and the versions they were built
// from.
type NodeBinaries struct {
	Kubelet       string
	KubeScheduler string
	KubeProxy     string

	Containerd string
	Ctr        string
	// ContainerdShim is containerd-shim-runc-v2; containerd finds it through
	// $PATH, so its directory must be on the PATH containerd runs with.
	ContainerdShim string
	// Runc is Debian's runc (hack/install-deps.sh installs it), found on
	// $PATH; empty if it is not installed.
	Runc string
	// Loopback is the CNI loopback plugin, which containerd's CRI plugin
	// runs in every pod's network namespace besides cellium-cni.
	Loopback string
	// CoreDNS is the cluster's DNS server (tools/coredns, static), which
	// test/realnode packs as the registry.k8s.io/coredns/coredns image.
	CoreDNS string

	KubernetesVersion string // e.g. "v1.37.2", from tools/k8s/go.mod
	ContainerdVersion string // e.g. "v2.4.2", from tools/containerd/go.mod
	CNIPluginsVersion string // e.g. "v1.10.0", from tools/cniplugins/go.mod
	CoreDNSVersion    string // e.g. "v1.15.0", from tools/coredns/go.mod
}

// Groups of node binaries that [EnsureNodeBinaries] can build on their own
// (make k8s-node-binaries, make containerd-binaries).
const (
	NodeGroupKubernetes = "kubernetes" // kubelet, kube-scheduler, kube-proxy
	NodeGroupContainerd = "containerd" // containerd, ctr, containerd-shim-runc-v2, the CNI loopback plugin
	NodeGroupCoreDNS    = "coredns"    // CoreDNS, the cluster DNS
)

// NodeGroups are the groups of node binaries, in build order.
var NodeGroups = []string{NodeGroupKubernetes, NodeGroupContainerd, NodeGroupCoreDNS}

// containerdBuildTags leave out the snapshotters this machine has no use
// for (and whose cgo-free builds need the tags).
const containerdBuildTags = "no_btrfs no_devmapper no_zfs"

// EnsureNodeBinaries returns the cached binaries of a real node, building
// those that are missing, like [EnsureBinaries]: kubelet, kube-scheduler and
// kube-proxy from tools/k8s into bin/k8s-<version>/ (beside kube-apiserver,
// with a recipe file of their own, .recipe-node, so neither group rebuilds
// the other); containerd, ctr and containerd-shim-runc-v2 from
// tools/containerd into bin/containerd-<version>/, without cgo; the CNI
// loopback plugin from tools/cniplugins into bin/cni-plugins-<version>/;
// CoreDNS from tools/coredns into bin/coredns-<version>/, without cgo.
// groups limits the build to some of [NodeGroups]; none means all. Runc is looked up on $PATH, never built.
//
// Errors: as EnsureBinaries; an unknown group.
func EnsureNodeBinaries(ctx context.Context, log *slog.Logger, groups ...string) (NodeBinaries, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	plan, bins, err := planNodeBinaries()
	if err != nil {
		return NodeBinaries{}, err
	}
	if len(groups) == 0 {
		groups = NodeGroups
	}
	for _, g := range groups {
		builds, ok := plan[g]
		if !ok {
			return NodeBinaries{}, fmt.Errorf("build node binaries: unknown group %q (want one of %s)", g, strings.Join(NodeGroups, ", "))
		}
		for _, b := range builds {
			if err := b.ensure(ctx, log); err != nil {
				return NodeBinaries{}, err
			}
		}
	}
	return bins, nil
}

// CachedNodeBinaries returns the node binaries if all of them are cached
// (built by the current recipe) and runc is installed; otherwise missing
// names what is not there, and nothing is built.
//
// Errors: the working directory is not inside the cellium checkout.
func CachedNodeBinaries() (bins NodeBinaries, missing []string, err error) {
	plan, bins, err := planNodeBinaries()
	if err != nil {
		return NodeBinaries{}, nil, err
	}
	for _, g := range NodeGroups {
		for _, b := range plan[g] {
			for _, p := range b.missing() {
				missing = append(missing, p.name)
			}
		}
	}
	if bins.Runc == "" {
		missing = append(missing, "runc")
	}
	return bins, missing, nil
}

// planNodeBinaries works out where each node binary lives and how to build
// it, by group.
func planNodeBinaries() (map[string][]toolBuild, NodeBinaries, error) {
	root, cache, err := repoAndCache()
	if err != nil {
		return nil, NodeBinaries{}, err
	}
	k8sMod := filepath.Join(root, "tools", "k8s")
	k8sVersion, err := requiredVersion(filepath.Join(k8sMod, "go.mod"), "k8s.io/kubernetes")
	if err != nil {
		return nil, NodeBinaries{}, err
	}
	ctrdMod := filepath.Join(root, "tools", "containerd")
	ctrdVersion, err := requiredVersion(filepath.Join(ctrdMod, "go.mod"), "github.com/containerd/containerd/v2")
	if err != nil {
		return nil, NodeBinaries{}, err
	}
	cniMod := filepath.Join(root, "tools", "cniplugins")
	cniVersion, err := requiredVersion(filepath.Join(cniMod, "go.mod"), "github.com/containernetworking/plugins")
	if err != nil {
		return nil, NodeBinaries{}, err
	}
	k8s := toolBuild{
		moduleDir:  k8sMod,
		version:    k8sVersion,
		ldflags:    kubernetesLdflags(k8sVersion),
		outDir:     filepath.Join(cache, "bin", "k8s-"+k8sVersion),
		recipeName: ".recipe-node",
		programs: []program{
			{name: "kubelet", pkg: "k8s.io/kubernetes/cmd/kubelet", estimate: 4 * time.Minute},
			{name: "kube-scheduler", pkg: "k8s.io/kubernetes/cmd/kube-scheduler", estimate: 2 * time.Minute},
			{name: "kube-proxy", pkg: "k8s.io/kubernetes/cmd/kube-proxy", estimate: 2 * time.Minute},
		},
	}
	ctrd := toolBuild{
		moduleDir: ctrdMod,
		version:   ctrdVersion,
		ldflags:   containerdLdflags(ctrdVersion),
		tags:      containerdBuildTags,
		env:       []string{"CGO_ENABLED=0"},
		outDir:    filepath.Join(cache, "bin", "containerd-"+ctrdVersion),
		programs: []program{
			{name: "containerd", pkg: "github.com/containerd/containerd/v2/cmd/containerd", estimate: 3 * time.Minute},
			{name: "ctr", pkg: "github.com/containerd/containerd/v2/cmd/ctr", estimate: time.Minute},
			{name: "containerd-shim-runc-v2", pkg: "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2", estimate: time.Minute},
		},
	}
	loopback := toolBuild{
		moduleDir:  cniMod,
		version:    cniVersion,
		outDir:     filepath.Join(cache, "bin", "cni-plugins-"+cniVersion),
		recipeName: ".recipe-node",
		programs: []program{
			{name: "loopback", pkg: "github.com/containernetworking/plugins/plugins/main/loopback", estimate: time.Minute},
		},
	}
	corednsMod := filepath.Join(root, "tools", "coredns")
	corednsVersion, err := requiredVersion(filepath.Join(corednsMod, "go.mod"), "github.com/coredns/coredns")
	if err != nil {
		return nil, NodeBinaries{}, err
	}
	coredns := toolBuild{
		moduleDir: corednsMod,
		version:   corednsVersion,
		ldflags:   corednsLdflags(corednsVersion),
		// Static: the image has no C library (upstream builds it so too).
		env:      []string{"CGO_ENABLED=0"},
		outDir:   filepath.Join(cache, "bin", "coredns-"+corednsVersion),
		programs: []program{{name: "coredns", pkg: ".", estimate: 10 * time.Minute}},
		// Its main.go chooses the plugins: a new one builds again.
		sources: []string{"main.go", "go.mod"},
	}
	runc, _ := exec.LookPath("runc")
	bins := NodeBinaries{
		Kubelet:           filepath.Join(k8s.outDir, "kubelet"),
		KubeScheduler:     filepath.Join(k8s.outDir, "kube-scheduler"),
		KubeProxy:         filepath.Join(k8s.outDir, "kube-proxy"),
		Containerd:        filepath.Join(ctrd.outDir, "containerd"),
		Ctr:               filepath.Join(ctrd.outDir, "ctr"),
		ContainerdShim:    filepath.Join(ctrd.outDir, "containerd-shim-runc-v2"),
		Runc:              runc,
		Loopback:          filepath.Join(loopback.outDir, "loopback"),
		CoreDNS:           filepath.Join(coredns.outDir, "coredns"),
		KubernetesVersion: k8sVersion,
		ContainerdVersion: ctrdVersion,
		CNIPluginsVersion: cniVersion,
		CoreDNSVersion:    corednsVersion,
	}
	return map[string][]toolBuild{
		NodeGroupKubernetes: {k8s},
		NodeGroupContainerd: {ctrd, loopback},
		NodeGroupCoreDNS:    {coredns},
	}, bins, nil
}

// containerdLdflags stamps the version into containerd's binaries, as its
// Makefile does (containerd --version, the CRI's runtime version).
func containerdLdflags(version string) string {
	const pkg = "github.com/containerd/containerd/v2/version"
	return "-X " + pkg + ".Version=" + version +
		" -X " + pkg + ".Revision=" + version +
		" -X " + pkg + ".Package=github.com/containerd/containerd/v2"
}

// corednsLdflags stamp the version into CoreDNS as its Makefile stamps the
// commit (coredns -version prints CoreDNS-1.15.0 and the stamp).
func corednsLdflags(version string) string {
	return "-X github.com/coredns/coredns/coremain.GitCommit=" + version
}
