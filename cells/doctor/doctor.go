package doctor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/cells/cepsync"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/k8s"
	"github.com/cellium/cellium/cells/statedir"
	"github.com/cellium/cellium/statedb/bpfprog"
	"github.com/cellium/cellium/statedb/endpoints"
	"github.com/cellium/cellium/statedb/health"
	"github.com/cellium/cellium/statedb/identity"
	ipamtables "github.com/cellium/cellium/statedb/ipam"
	"github.com/cellium/cellium/statedb/ipcache"
	"github.com/cellium/cellium/statedb/mapstate"
	"github.com/cellium/cellium/statedb/nodes"
)

// LinkLister lists the host-side endpoint interfaces: links of the host
// namespace whose name starts with "lxc". The agent binary provides it
// from datapath/link; without it the veth checks are skipped.
type LinkLister interface {
	ListHostLinks() ([]HostLink, error)
}

// Params are New's inputs. Everything but the database and the endpoints
// table is optional: a missing source skips its checks.
type Params struct {
	hive.In

	Config    Config
	DB        *statedb.DB
	Endpoints statedb.Table[*endpoints.Endpoint]

	Node     k8s.NodeName                          `optional:"true"`
	StateDir statedir.Dir                          `optional:"true"`
	IPAM     statedb.Table[*ipamtables.Allocation] `optional:"true"`
	// Identities is the identity allocator's table of this agent's
	// references.
	Identities statedb.Table[*identity.Allocation]     `optional:"true"`
	Links      LinkLister                              `optional:"true"`
	Pods       statedb.Table[*corev1.Pod]              `optional:"true"`
	CEPs       statedb.Table[*ciliumv2.CiliumEndpoint] `optional:"true"`
	// LocalNode is nodediscovery's table: this node's InternalIP.
	LocalNode statedb.Table[*nodes.LocalNode] `optional:"true"`
	// CEPSync tells whether this agent writes CiliumEndpoints at all.
	CEPSync cepsync.Config `optional:"true"`
	// Programs is the eBPF loader's table (absent with the loader off).
	Programs statedb.Table[*bpfprog.Program] `optional:"true"`
	// PolicyMaps is the policy map reconciler's table (absent with the
	// BPF datapath off).
	PolicyMaps statedb.Table[*mapstate.PolicyMap] `optional:"true"`
	// ClusterNodes is the nodes table (CiliumNodes, with refusals).
	ClusterNodes statedb.Table[*nodes.Node] `optional:"true"`
	// RefusedCEPs is the ipcache's table of the CEPs it refuses.
	RefusedCEPs statedb.Table[*ipcache.RefusedCEP] `optional:"true"`
	// NodePaths are the health probes of other nodes (absent with
	// --enable-health-checking=false).
	NodePaths statedb.Table[*health.NodePath] `optional:"true"`
}

// Doctor gathers the facts and checks them. Safe for concurrent use.
type Doctor struct {
	p Params
}

// New returns the doctor; it does no I/O until Run.
func New(p Params) *Doctor { return &Doctor{p: p} }

// Run checks the node and returns the report. When the first look finds
// something it looks again after the settle time and reports only the
// findings (same kind and object) that both looks found, with the second
// look's text.
//
// Errors: ctx's error when it ends during the settle time.
func (d *Doctor) Run(ctx context.Context) (models.DoctorReport, error) {
	facts := d.Facts()
	first := Check(facts)
	if len(first) == 0 || d.p.Config.DoctorSettleTime == 0 {
		return models.DoctorReport{Findings: first, Skipped: facts.Skipped}, nil
	}
	t := time.NewTimer(d.p.Config.DoctorSettleTime)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return models.DoctorReport{}, fmt.Errorf("wait to confirm %d findings: %w", len(first), ctx.Err())
	case <-t.C:
	}
	seen := map[[2]string]bool{}
	for _, f := range first {
		seen[[2]string{f.Kind, f.Object}] = true
	}
	facts = d.Facts()
	confirmed := []models.DoctorFinding{}
	for _, f := range Check(facts) {
		if seen[[2]string{f.Kind, f.Object}] {
			confirmed = append(confirmed, f)
		}
	}
	return models.DoctorReport{Findings: confirmed, Skipped: facts.Skipped}, nil
}

// Facts gathers one snapshot. The tables are read in one transaction; the
// allocations, links and files just after it.
func (d *Doctor) Facts() *Facts {
	f := &Facts{}
	txn := d.p.DB.ReadTxn()
	if ok, _ := d.p.Endpoints.Initialized(txn); !ok {
		f.Skipped = append(f.Skipped, "all checks: the endpoints are not restored yet; try again in a moment")
		return f
	}
	f.Endpoints = statedb.Collect(d.p.Endpoints.All(txn))
	d.pods(txn, f)
	d.ceps(txn, f)
	d.identities(txn, f)
	d.programs(txn, f)
	d.policyMaps(txn, f)
	if d.p.ClusterNodes != nil {
		f.ClusterNodes, f.ClusterNodesKnown = statedb.Collect(d.p.ClusterNodes.All(txn)), true
	}
	if d.p.NodePaths != nil {
		f.NodePaths, f.NodePathsKnown = statedb.Collect(d.p.NodePaths.All(txn)), true
	}
	if d.p.RefusedCEPs != nil {
		f.RefusedCEPs, f.RefusedCEPsKnown = statedb.Collect(d.p.RefusedCEPs.All(txn)), true
	}
	d.allocations(f)
	d.links(f)
	d.stateFiles(f)
	return f
}

func (d *Doctor) programs(txn statedb.ReadTxn, f *Facts) {
	if d.p.Programs == nil {
		return // the loader is off (--enable-bpf-datapath=false): no programs to check
	}
	if ok, _ := d.p.Programs.Initialized(txn); !ok {
		d.skip(f, "eBPF programs: the loader has not derived its table yet")
		return
	}
	f.Programs, f.ProgramsKnown = statedb.Collect(d.p.Programs.All(txn)), true
}

func (d *Doctor) policyMaps(txn statedb.ReadTxn, f *Facts) {
	if d.p.PolicyMaps == nil {
		return // the BPF datapath is off: no policy maps to check
	}
	if ok, _ := d.p.PolicyMaps.Initialized(txn); !ok {
		d.skip(f, "policy maps: the datapath has not derived its table yet")
		return
	}
	f.PolicyMaps, f.PolicyMapsKnown = statedb.Collect(d.p.PolicyMaps.All(txn)), true
}

func (d *Doctor) skip(f *Facts, format string, args ...any) {
	f.Skipped = append(f.Skipped, fmt.Sprintf(format, args...))
}

func (d *Doctor) pods(txn statedb.ReadTxn, f *Facts) {
	if d.p.Pods == nil {
		d.skip(f, "pods: no pods table in this agent")
		return
	}
	if ok, _ := d.p.Pods.Initialized(txn); !ok {
		d.skip(f, "pods: the pods table is not synced with the API server yet")
		return
	}
	for p := range d.p.Pods.All(txn) {
		if d.p.Node == "" || p.Spec.NodeName == string(d.p.Node) {
			f.Pods = append(f.Pods, p)
		}
	}
	f.PodsKnown = true
}

func (d *Doctor) ceps(txn statedb.ReadTxn, f *Facts) {
	if d.p.CEPSync.DisableEndpointCRD {
		d.skip(f, "CiliumEndpoints: this agent does not write them (--disable-endpoint-crd)")
		return
	}
	if d.p.CEPs == nil || d.p.LocalNode == nil {
		d.skip(f, "CiliumEndpoints: no CiliumEndpoints or local-node table in this agent")
		return
	}
	if ok, _ := d.p.CEPs.Initialized(txn); !ok {
		d.skip(f, "CiliumEndpoints: the CiliumEndpoints table is not synced with the API server yet")
		return
	}
	nodeIP, _ := nodes.LocalInternalIP(txn, d.p.LocalNode, string(d.p.Node))
	if nodeIP == "" {
		d.skip(f, "CiliumEndpoints: node %q has no InternalIP in the local-node table yet, so this node's CiliumEndpoints cannot be told apart", d.p.Node)
		return
	}
	for cep := range d.p.CEPs.All(txn) {
		if cep.Status.Networking != nil && cep.Status.Networking.NodeIP == nodeIP {
			f.CEPs = append(f.CEPs, cep)
		}
	}
	f.CEPsKnown = true
}

// identities reads the identity allocator's table of references.
func (d *Doctor) identities(txn statedb.ReadTxn, f *Facts) {
	if d.p.Identities == nil {
		d.skip(f, "identity references: no identity allocator in this agent")
		return
	}
	refs := map[identity.NumericIdentity]int{}
	for row := range d.p.Identities.All(txn) {
		refs[row.ID] += row.Refs
	}
	f.IdentityRefs, f.IdentityRefsKnown = refs, true
}

func (d *Doctor) allocations(f *Facts) {
	if d.p.IPAM == nil {
		d.skip(f, "IP allocations: no IPAM in this agent")
		return
	}
	txn := d.p.DB.ReadTxn()
	if init, _ := d.p.IPAM.Initialized(txn); !init {
		d.skip(f, "IP allocations: the node has no pod CIDRs yet")
		return
	}
	f.Allocations = []Allocation{}
	for a := range d.p.IPAM.All(txn) {
		f.Allocations = append(f.Allocations, Allocation{IP: a.IP, Owner: a.Owner})
	}
	f.AllocationsKnown = true
}

func (d *Doctor) links(f *Facts) {
	if d.p.Links == nil {
		d.skip(f, "veths: this agent cannot list host interfaces")
		return
	}
	links, err := d.p.Links.ListHostLinks()
	if err != nil {
		d.skip(f, "veths: %v", err)
		return
	}
	f.Links, f.LinksKnown = links, true
}

// stateFiles lists <state-dir>/endpoints/<ID>.json, the endpoint manager's
// files. Other names (temporary files, quarantined files) are not state.
func (d *Doctor) stateFiles(f *Facts) {
	if d.p.StateDir == "" {
		d.skip(f, "state files: no state directory in this agent")
		return
	}
	dir := filepath.Join(string(d.p.StateDir), endpointStateSubdirectory)
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		d.skip(f, "state files: %v", err)
		return
	}
	f.StateFiles = map[uint16]string{}
	for _, e := range entries {
		base, ok := strings.CutSuffix(e.Name(), stateFileSuffix)
		if !ok || !e.Type().IsRegular() {
			continue
		}
		id, err := strconv.ParseUint(base, 10, 16)
		if err != nil || id == 0 {
			continue
		}
		f.StateFiles[uint16(id)] = filepath.Join(dir, e.Name())
	}
	f.StateFilesKnown = true
}
