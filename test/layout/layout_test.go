// Package layout checks the dependency direction of DESIGN.md §2:
// control-plane cells and the operator never import the datapath or the
// BPF code; statedb and api never import cells; no binary imports another
// binary's package; the operator links no agent-only cell; cells meet
// through tables, not by holding each other's allocator or lookup
// interfaces (cells_test.go).
package layout

import (
	"encoding/json"
	"io"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/cellium/cellium"

type pkg struct {
	ImportPath string
	Deps       []string
}

func listDeps(t *testing.T) []pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps=false", "-json=ImportPath,Deps", module+"/...")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs []pkg
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

func under(path, dir string) bool {
	full := module + "/" + dir
	return path == full || strings.HasPrefix(path, full+"/")
}

func TestDependencyDirection(t *testing.T) {
	rules := []struct {
		from      string
		forbidden []string
	}{
		{"cells", []string{"datapath", "bpf", "daemon", "operator", "cni", "cli"}},
		{"operator", []string{"datapath", "bpf"}},
		{"statedb", []string{"cells", "datapath", "daemon", "operator", "cni", "cli"}},
		{"api", []string{"cells", "statedb", "datapath", "daemon", "operator", "cni", "cli"}},
		{"datapath", []string{"cells", "daemon", "operator", "cni", "cli"}},
	}
	pkgs := listDeps(t)
	if len(pkgs) < 20 {
		t.Fatalf("go list found only %d packages", len(pkgs))
	}
	for _, p := range pkgs {
		for _, r := range rules {
			if !under(p.ImportPath, r.from) {
				continue
			}
			for _, dep := range p.Deps {
				for _, f := range r.forbidden {
					if under(dep, f) {
						t.Errorf("%s imports %s: %s/ must not depend on %s/", p.ImportPath, dep, r.from, f)
					}
				}
			}
		}
	}
}

// binaries are the four programs' trees. Each may import only its own tree:
// what two of them share lives in cells/ (the command builder is
// hive.NewDaemonCommand).
var binaries = []string{"daemon", "operator", "cni", "cli"}

func TestBinariesDoNotImportEachOther(t *testing.T) {
	pkgs := listDeps(t)
	for _, p := range pkgs {
		for _, from := range binaries {
			if !under(p.ImportPath, from) {
				continue
			}
			for _, dep := range p.Deps {
				for _, other := range binaries {
					if other != from && under(dep, other) {
						t.Errorf("%s imports %s: binary %s/ must not depend on binary %s/", p.ImportPath, dep, from, other)
					}
				}
			}
		}
	}
}

// agentOnly are the cells that only make sense on a node: the CNI API,
// endpoints and their CEPs, IPAM of this node, identity allocation for
// local endpoints, the node's own discovery, the state directory. The
// operator's controllers work on cluster-wide objects and need none of them.
var agentOnly = []string{
	"cells/agentapi",
	"cells/cepsync",
	"cells/cniconfig",
	"cells/endpointmanager",
	"cells/identity",
	"cells/ipam",
	"cells/monitor",
	"cells/nodediscovery",
	"cells/statedir",
	"statedb/endpoints",
	"statedb/nodes",
}

func TestOperatorLinksNoAgentOnlyCell(t *testing.T) {
	pkgs := listDeps(t)
	seen := false
	for _, p := range pkgs {
		if !under(p.ImportPath, "operator") {
			continue
		}
		seen = true
		for _, dep := range p.Deps {
			for _, a := range agentOnly {
				if under(dep, a) {
					t.Errorf("%s imports %s: the operator must not link the agent-only %s", p.ImportPath, dep, a)
				}
			}
		}
	}
	if !seen {
		t.Fatal("go list found no operator package")
	}
}

// TestLightClients: the CNI plugin, exec'd by the container runtime for
// every pod, and the agent API's client and wire types link no Kubernetes
// library (apimachinery alone added 4 MB and ~13 ms of init per exec).
func TestLightClients(t *testing.T) {
	for _, pkg := range []string{"./cni/cellium-cni", "./api/v1/models", "./api/v1/client"} {
		cmd := exec.Command("go", "list", "-deps", pkg)
		cmd.Dir = "../.."
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		deps := strings.Fields(string(out))
		if len(deps) < 10 {
			t.Fatalf("go list -deps %s found only %d packages", pkg, len(deps))
		}
		for _, dep := range deps {
			if strings.HasPrefix(dep, "k8s.io/") || strings.Contains(dep, "apimachinery") ||
				strings.HasPrefix(dep, "sigs.k8s.io/") || under(dep, "api/cilium.io") {
				t.Errorf("%s depends on %s: it must not link Kubernetes libraries or the CRD types", pkg, dep)
			}
		}
	}
}
