package soak

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/cellium/cellium/api/client/clientset/versioned"
	"github.com/cellium/cellium/api/v1/client"
	"github.com/cellium/cellium/cells/ipam"
	"github.com/cellium/cellium/datapath/link"
	"github.com/cellium/cellium/test/devkubelet"
)

// allocationsTable is the agent's table of identity references.
const allocationsTable = "identity-allocations"

// sources are where a snapshot is read from.
type sources struct {
	namespace     string
	cs            kubernetes.Interface
	cilium        versioned.Interface
	agent         *client.Client
	kubeletState  string // devkubelet.Config.StateDir
	agentStateDir string // the agent's --state-dir
	netnsDir      string
	netnsPrefixes []string
	// host is the host network namespace, opened when the soak
	// started: link.Host{} would use /proc/self/ns/net, the main
	// thread's namespace, which a goroutine that made a pod's netns
	// (devkubelet, testutils.NewNS) and exited locked on the main
	// thread leaves in that pod's namespace for good.
	host link.Host
	// bpfRoot is the agent's bpffs root when it runs with the eBPF
	// datapath: the snapshot then reads its pinned state.
	bpfRoot string
	// noAllocations is set once the agent said it has no allocations
	// table (the refs check is then skipped).
	noAllocations bool
}

// snapshot reads everything Check compares. An error means a source did
// not answer (the agent restarts, the API server is down): try again.
func (src *sources) snapshot(ctx context.Context) (*Snapshot, error) {
	s := &Snapshot{Namespace: src.namespace, PodLinks: map[string][]PodLink{}, Identities: map[string]bool{}}

	// Node-local state that the API answers depend on is read first,
	// then the agent, then the API server: a pod created meanwhile shows
	// up as in flight (retried), not as a leak.
	var err error
	if s.Sandboxes, err = devkubelet.LoadSandboxes(src.kubeletState); err != nil {
		return nil, fmt.Errorf("sandboxes: %w", err)
	}
	if s.Endpoints, err = src.agent.GetEndpoints(ctx); err != nil {
		return nil, fmt.Errorf("agent endpoints: %w", err)
	}
	if err := src.agent.Do(ctx, http.MethodGet, "/v1/ipam", nil, &s.IPAM); err != nil {
		return nil, fmt.Errorf("agent IPAM: %w", err)
	}
	if !src.noAllocations {
		raw, err := src.agent.GetStatedbTable(ctx, allocationsTable)
		switch {
		case client.IsNotFound(err):
			src.noAllocations = true
		case err != nil:
			return nil, fmt.Errorf("agent identity allocations: %w", err)
		default:
			s.Allocations = []Allocation{}
			if err := json.Unmarshal(raw, &s.Allocations); err != nil {
				return nil, fmt.Errorf("decode identity allocations: %w", err)
			}
		}
	}
	if src.bpfRoot != "" {
		if s.Datapath, err = readDatapath(ctx, src.agent, src.bpfRoot); err != nil {
			return nil, fmt.Errorf("datapath: %w", err)
		}
	}
	if s.StateFiles, err = listDir(filepath.Join(src.agentStateDir, "endpoints")); err != nil {
		return nil, err
	}
	s.IPAMStateFile = readIPAMState(filepath.Join(src.agentStateDir, ipam.StateSubdir, ipam.StateFileName))
	if s.HostLinks, err = src.host.ListHostInterfaces(); err != nil {
		return nil, err
	}
	names, err := listDir(src.netnsDir)
	if err != nil {
		return nil, err
	}
	for _, n := range names {
		for _, p := range src.netnsPrefixes {
			if strings.HasPrefix(n, p) {
				s.Netns = append(s.Netns, n)
				break
			}
		}
	}
	for _, sb := range s.Sandboxes {
		if links, err := podLinks(sb.NetnsPath); err == nil {
			s.PodLinks[sb.ID] = links
		}
	}

	pods, err := src.cs.CoreV1().Pods(src.namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list pods: %w", err)
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		s.Pods = append(s.Pods, Pod{Name: p.Name, UID: string(p.UID), IP: p.Status.PodIP,
			Running: p.Status.Phase == corev1.PodRunning, Deleting: p.DeletionTimestamp != nil})
	}
	ceps, err := src.cilium.CiliumV2().CiliumEndpoints(src.namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list CiliumEndpoints: %w", err)
	}
	for i := range ceps.Items {
		c := &ceps.Items[i]
		cep := CEP{Name: c.Name, UID: string(c.UID), State: string(c.Status.State), ID: c.Status.ID}
		for _, ref := range c.OwnerReferences {
			if ref.Kind == "Pod" {
				cep.OwnerUIDs = append(cep.OwnerUIDs, string(ref.UID))
			}
		}
		if n := c.Status.Networking; n != nil && len(n.Addressing) > 0 && n.Addressing[0] != nil {
			cep.IP = n.Addressing[0].IPV4
		}
		if c.Status.Identity != nil {
			cep.Identity = c.Status.Identity.ID
		}
		s.CEPs = append(s.CEPs, cep)
	}
	ids, err := src.cilium.CiliumV2().CiliumIdentities().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list CiliumIdentities: %w", err)
	}
	for _, id := range ids.Items {
		s.Identities[id.Name] = true
	}
	return s, nil
}

// listDir returns the names in dir; a missing dir is empty.
func listDir(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", dir, err)
	}
	out := make([]string, 0, len(entries))
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out, nil
}

// readIPAMState returns the addresses in the agent's IPAM state file, or
// nil if it cannot be read (the check is then skipped).
func readIPAMState(path string) []string {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var f struct {
		Allocations []struct {
			IP string `json:"ip"`
		} `json:"allocations"`
	}
	if err := json.Unmarshal(data, &f); err != nil {
		return nil
	}
	out := []string{}
	for _, a := range f.Allocations {
		out = append(out, a.IP)
	}
	return out
}

// podLinks lists the interfaces but lo in the network namespace at path,
// with their IPv4 addresses.
func podLinks(path string) ([]PodLink, error) {
	n, err := ns.GetNS(path)
	if err != nil {
		return nil, err
	}
	defer n.Close()
	var out []PodLink
	err = n.Do(func(ns.NetNS) error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			if l.Attrs().Name == "lo" {
				continue
			}
			pl := PodLink{Name: l.Attrs().Name}
			addrs, err := netlink.AddrList(l, netlink.FAMILY_V4)
			if err != nil {
				return err
			}
			for _, a := range addrs {
				pl.Addrs = append(pl.Addrs, a.IP.String())
			}
			out = append(out, pl)
		}
		return nil
	})
	return out, err
}
