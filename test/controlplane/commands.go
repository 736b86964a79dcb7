package controlplane

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	goruntime "runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/cilium/hive/script"
	"github.com/cilium/statedb"
	"github.com/spf13/pflag"
	k8serrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	k8stesting "k8s.io/client-go/testing"

	ciliumv2 "github.com/cellium/cellium/api/cilium.io/v2"
	ciliumscheme "github.com/cellium/cellium/api/client/clientset/versioned/scheme"
	"github.com/cellium/cellium/api/v1/models"
)

func (h *Harness) commands() map[string]script.Cmd {
	return map[string]script.Cmd{
		"hive/start":      h.startCmd(),
		"k8s/add":         h.k8sCmd("add"),
		"k8s/update":      h.k8sCmd("update"),
		"k8s/delete":      h.k8sCmd("delete"),
		"endpoint/add":    h.endpointAddCmd(),
		"endpoint/delete": h.endpointDeleteCmd(),
		"maps/list":       h.mapsListCmd(),
		"maps/dump":       h.mapsDumpCmd(),
		"maps/cmp":        h.mapsCmpCmd(),
		"host/sockets":    h.hostSocketsCmd(),
	}
}

func (h *Harness) startCmd() script.Cmd {
	return script.Command(script.CmdUsage{
		Summary: "Start the agent's hive",
		Detail: []string{
			"Objects added with k8s/add before hive/start are in the first list",
			"of the resource mirrors; hive/start returns once every mirror watches.",
		},
	}, func(s *script.State, args ...string) (script.WaitFunc, error) {
		if len(args) > 0 {
			return nil, script.ErrUsage
		}
		ctx, cancel := context.WithTimeout(s.Context(), time.Minute)
		defer cancel()
		if err := h.Start(ctx); err != nil {
			return nil, fmt.Errorf("start the hive: %w", err)
		}
		return nil, nil
	})
}

// scheme decodes the core Kubernetes kinds and cilium.io's.
func newScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := ciliumscheme.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}

// decodeObjects reads the objects of a YAML file (several documents
// separated by ---).
func decodeObjects(data []byte) ([]runtime.Object, []schema.GroupVersionKind, error) {
	dec := serializer.NewCodecFactory(newScheme()).UniversalDeserializer()
	r := utilyaml.NewYAMLReader(bufioReader(data))
	var objs []runtime.Object
	var gvks []schema.GroupVersionKind
	for {
		doc, err := r.Read()
		if err != nil {
			if errors.Is(err, errEOF) {
				return objs, gvks, nil
			}
			return nil, nil, err
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj, gvk, err := dec.Decode(doc, nil, nil)
		if err != nil {
			return nil, nil, fmt.Errorf("decode %q: %w (is apiVersion/kind a core Kubernetes or cilium.io/v2 kind?)", firstLine(doc), err)
		}
		objs = append(objs, obj)
		gvks = append(gvks, *gvk)
	}
}

func firstLine(b []byte) string {
	l, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	return l
}

func (h *Harness) k8sCmd(verb string) script.Cmd {
	summary := map[string]string{
		"add":    "Create Kubernetes objects (update those that exist) in the fake API server",
		"update": "Update Kubernetes objects in the fake API server",
		"delete": "Delete Kubernetes objects from the fake API server",
	}[verb]
	return script.Command(script.CmdUsage{
		Summary: summary,
		Args:    "file.yaml...",
		Detail: []string{
			"Each file holds one or more objects (YAML documents separated by ---):",
			"core Kubernetes kinds and cilium.io/v2 kinds. The agent's resource",
			"mirrors see them as they would see the API server's.",
		},
	}, func(s *script.State, args ...string) (script.WaitFunc, error) {
		if len(args) == 0 {
			return nil, script.ErrUsage
		}
		for _, file := range args {
			data, err := os.ReadFile(s.Path(file))
			if err != nil {
				return nil, fmt.Errorf("read %s: %w", file, err)
			}
			objs, gvks, err := decodeObjects(data)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", file, err)
			}
			for i, obj := range objs {
				if err := h.apply(verb, obj, gvks[i]); err != nil {
					return nil, fmt.Errorf("%s: %w", file, err)
				}
			}
		}
		return nil, nil
	})
}

// apply runs verb on obj through the fake's reactors, as a client's
// Create, Update or Delete would.
func (h *Harness) apply(verb string, obj runtime.Object, gvk schema.GroupVersionKind) error {
	m, err := meta.Accessor(obj)
	if err != nil {
		return err
	}
	gvr, _ := meta.UnsafeGuessKindToResource(gvk)
	fake := &h.Clientset.Fake
	if gvk.Group == ciliumv2.SchemeGroupVersion.Group {
		fake = &h.Clientset.CiliumFake.Fake
	}
	ns, name := m.GetNamespace(), m.GetName()
	what := fmt.Sprintf("%s %s", gvk.Kind, strings.TrimPrefix(ns+"/"+name, "/"))
	switch verb {
	case "add":
		_, err = fake.Invokes(k8stesting.NewCreateAction(gvr, ns, obj), nil)
		if k8serrors.IsAlreadyExists(err) {
			_, err = fake.Invokes(k8stesting.NewUpdateAction(gvr, ns, obj), nil)
		}
	case "update":
		_, err = fake.Invokes(k8stesting.NewUpdateAction(gvr, ns, obj), nil)
	case "delete":
		_, err = fake.Invokes(k8stesting.NewDeleteAction(gvr, ns, name), nil)
	}
	if err != nil {
		return fmt.Errorf("%s %s: %w", verb, what, err)
	}
	return nil
}

func (h *Harness) endpointAddCmd() script.Cmd {
	return script.Command(script.CmdUsage{
		Summary: "Make a pod's endpoint as the CNI plugin does",
		Args:    "namespace/pod",
		Flags: func(fs *pflag.FlagSet) {
			fs.String("container-id", "", "Container ID (default c-<namespace>-<pod>)")
		},
		Detail: []string{
			"POST /v1/ipam for the pod, then PUT /v1/endpoint with the address,",
			"waiting until the endpoint is ready (its policy map is written).",
			"The host interface is lxc-<pod> with the next ifindex from 100,",
			"the MACs are derived from the ifindex. Prints the endpoint's ID and IPv4.",
		},
	}, func(s *script.State, args ...string) (script.WaitFunc, error) {
		if len(args) != 1 {
			return nil, script.ErrUsage
		}
		ns, pod, ok := strings.Cut(args[0], "/")
		if !ok || ns == "" || pod == "" {
			return nil, fmt.Errorf("endpoint/add %q: want namespace/pod", args[0])
		}
		cid, _ := s.Flags.GetString("container-id")
		if cid == "" {
			cid = "c-" + ns + "-" + pod
		}
		ctx, cancel := context.WithTimeout(s.Context(), 30*time.Second)
		defer cancel()
		alloc, err := h.API.AllocateIP(ctx, ns+"/"+pod, cid)
		if err != nil {
			return nil, fmt.Errorf("allocate an IP for %s: %w", args[0], err)
		}
		idx := h.ifindex
		h.ifindex++
		ep, err := h.API.PutEndpoint(ctx, &models.EndpointChangeRequest{
			ContainerID: cid, ContainerInterfaceName: "eth0",
			K8sNamespace: ns, K8sPodName: pod,
			InterfaceName: "lxc-" + pod, InterfaceIndex: idx,
			MAC:        fmt.Sprintf("0a:00:00:00:00:%02x", idx%256),
			HostMAC:    fmt.Sprintf("0e:00:00:00:00:%02x", idx%256),
			Addressing: models.AddressPair{IPV4: alloc.IPv4.IP}, SyncBuildEndpoint: true,
		})
		if err != nil {
			return nil, fmt.Errorf("create the endpoint of %s: %w\n%s", args[0], err, h.stuckState())
		}
		return func(*script.State) (string, string, error) {
			return fmt.Sprintf("endpoint %d ipv4 %s\n", ep.ID, alloc.IPv4.IP), "", nil
		}, nil
	})
}

func (h *Harness) endpointDeleteCmd() script.Cmd {
	return script.Command(script.CmdUsage{
		Summary: "Delete a pod's endpoint as the CNI plugin's DEL does",
		Args:    "namespace/pod",
		Flags: func(fs *pflag.FlagSet) {
			fs.String("container-id", "", "Container ID (default c-<namespace>-<pod>)")
		},
	}, func(s *script.State, args ...string) (script.WaitFunc, error) {
		if len(args) != 1 {
			return nil, script.ErrUsage
		}
		ns, pod, ok := strings.Cut(args[0], "/")
		if !ok {
			return nil, fmt.Errorf("endpoint/delete %q: want namespace/pod", args[0])
		}
		cid, _ := s.Flags.GetString("container-id")
		if cid == "" {
			cid = "c-" + ns + "-" + pod
		}
		ctx, cancel := context.WithTimeout(s.Context(), 30*time.Second)
		defer cancel()
		found, err := h.API.DeleteEndpointByContainerID(ctx, cid)
		if err != nil {
			return nil, fmt.Errorf("delete the endpoint of %s: %w", args[0], err)
		}
		if !found {
			return nil, fmt.Errorf("delete the endpoint of %s: the agent has none for container %s", args[0], cid)
		}
		return nil, nil
	})
}

func (h *Harness) mapsListCmd() script.Cmd {
	return script.Command(script.CmdUsage{Summary: "List the fake BPF maps"},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			names := h.Maps.Names()
			return func(*script.State) (string, string, error) { return strings.Join(names, "\n") + "\n", "", nil }, nil
		})
}

// render writes a map's dump as aligned text.
func render(header []string, rows [][]string) string {
	var buf bytes.Buffer
	w := tabwriter.NewWriter(&buf, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, strings.Join(header, "\t"))
	for _, r := range rows {
		fmt.Fprintln(w, strings.Join(r, "\t"))
	}
	w.Flush()
	var out []string
	for _, l := range strings.Split(buf.String(), "\n") {
		out = append(out, strings.TrimRight(l, " "))
	}
	return strings.Join(out, "\n")
}

func (h *Harness) mapsDumpCmd() script.Cmd {
	return script.Command(script.CmdUsage{
		Summary: "Show the entries of a fake BPF map",
		Args:    "map",
		Detail:  []string{"maps/list names the maps. Columns are separated by spaces."},
	}, func(s *script.State, args ...string) (script.WaitFunc, error) {
		if len(args) != 1 {
			return nil, script.ErrUsage
		}
		header, rows, err := h.Maps.Dump(args[0])
		if err != nil {
			return nil, err
		}
		out := render(header, rows)
		return func(*script.State) (string, string, error) { return out, "", nil }, nil
	})
}

// fields splits text into lines of whitespace-separated fields, without
// empty lines: what maps/cmp compares.
func fields(text string) [][]string {
	var out [][]string
	for _, l := range strings.Split(text, "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			out = append(out, f)
		}
	}
	return out
}

func (h *Harness) mapsCmpCmd() script.Cmd {
	return script.Command(script.CmdUsage{
		Summary: "Wait until a fake BPF map holds what a file says",
		Args:    "map file",
		Flags: func(fs *pflag.FlagSet) {
			fs.Duration("timeout", 5*time.Second, "How long to wait for the map to match")
		},
		Detail: []string{
			"The file is in maps/dump's format: a header line, then one line per",
			"entry; columns are compared field by field, spacing does not matter.",
			"The header may name a subset of the map's columns, in any order: only",
			"those are compared.",
			"With -scripttest.update the file is rewritten from the map.",
		},
	}, func(s *script.State, args ...string) (script.WaitFunc, error) {
		if len(args) != 2 {
			return nil, script.ErrUsage
		}
		timeout, err := s.Flags.GetDuration("timeout")
		if err != nil {
			return nil, err
		}
		name, file := args[0], args[1]
		data, err := os.ReadFile(s.Path(file))
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", file, err)
		}
		want := fields(s.ExpandEnv(string(data), false))
		deadline := time.After(timeout)
		for {
			changed := h.Maps.Changed()
			header, rows, err := h.Maps.Dump(name)
			if err != nil {
				return nil, err
			}
			if len(want) > 0 {
				if header, rows, err = project(header, rows, want[0]); err != nil {
					return nil, fmt.Errorf("%s: %w", file, err)
				}
			}
			got := render(header, rows)
			if slices.EqualFunc(fields(got), want, slices.Equal) {
				return nil, nil
			}
			select {
			case <-changed:
			case <-s.Context().Done():
				return nil, s.Context().Err()
			case <-deadline:
				if s.DoUpdate {
					s.FileUpdates[file] = got
					return nil, nil
				}
				return nil, fmt.Errorf("map %s does not match %s after %v:\n--- want\n%s\n--- got\n%s", name, file, timeout,
					strings.TrimSpace(string(data)), strings.TrimSpace(got))
			}
		}
	})
}

// project keeps the columns of header and rows that cols names, in its
// order: a file compares the columns it names (as db/cmp does).
func project(header []string, rows [][]string, cols []string) ([]string, [][]string, error) {
	if slices.Equal(header, cols) {
		return header, rows, nil
	}
	idx := make([]int, len(cols))
	for i, c := range cols {
		if idx[i] = slices.Index(header, c); idx[i] < 0 {
			return nil, nil, fmt.Errorf("no column %q (the map has %s)", c, strings.Join(header, ", "))
		}
	}
	out := make([][]string, len(rows))
	for r, row := range rows {
		out[r] = make([]string, len(idx))
		for i, j := range idx {
			out[r][i] = row[j]
		}
	}
	return cols, out, nil
}

var errEOF = io.EOF

func bufioReader(b []byte) *bufio.Reader { return bufio.NewReader(bytes.NewReader(b)) }

// stuckTables are the tables stuckState shows: where an endpoint's
// creation waits.
var stuckTables = []string{"endpoints", "identity-requests", "ipam-requests", "endpoint-policies", "policy-maps"}

// stuckState describes what an endpoint that did not become ready waits
// for: the rows of stuckTables, then every goroutine's stack (a failed
// endpoint/add in CI is then readable from its log alone).
func (h *Harness) stuckState() string {
	var b strings.Builder
	txn := h.DB.ReadTxn()
	for _, name := range stuckTables {
		meta := h.DB.GetTable(txn, name)
		if meta == nil {
			continue
		}
		fmt.Fprintf(&b, "--- table %s:\n", name)
		for obj := range (statedb.AnyTable{Meta: meta}).All(txn) {
			fmt.Fprintf(&b, "  %+v\n", obj)
		}
	}
	stacks := make([]byte, 1<<20)
	stacks = stacks[:goruntime.Stack(stacks, true)]
	fmt.Fprintf(&b, "--- goroutines:\n%s", stacks)
	return b.String()
}
