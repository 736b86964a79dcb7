package metrics

import (
	"fmt"
	"slices"
	"strings"
)

// Names of the metrics --hubble-metrics can enable, as Hubble names them.
const (
	MetricFlow             = "flow"
	MetricDrop             = "drop"
	MetricPolicy           = "policy"
	MetricTCP              = "tcp"
	MetricPortDistribution = "port-distribution"
)

// knownNames are the metrics cellium counts, sorted.
var knownNames = []string{MetricDrop, MetricFlow, MetricPolicy, MetricPortDistribution, MetricTCP}

// notCounted are Hubble's metrics cellium has no events for.
var notCounted = map[string]string{
	"dns":            "it needs the L7 DNS proxy, which cellium does not have",
	"http":           "it needs the L7 HTTP proxy, which cellium does not have",
	"httpV2":         "it needs the L7 HTTP proxy, which cellium does not have",
	"kafka":          "it needs the L7 Kafka proxy, which cellium does not have",
	"icmp":           "cellium does not count it yet",
	"sctp":           "cellium's datapath does not handle SCTP",
	"flows-to-world": "cellium does not count it yet",
}

func knownNamesList() string { return strings.Join(knownNames, ", ") }

// Context is one way of naming a flow's source or destination in a label
// (Hubble's context identifiers).
type Context uint8

// The contexts, with the names --hubble-metrics gives them.
const (
	// ContextIdentity is the endpoint's identity labels, joined by commas.
	ContextIdentity Context = iota + 1
	// ContextNamespace is the pod's namespace.
	ContextNamespace
	// ContextPod is namespace/pod-name.
	ContextPod
	// ContextPodName is the pod's name alone.
	ContextPodName
	// ContextDNS is the DNS names the flow carries for the endpoint.
	ContextDNS
	// ContextIP is the endpoint's IP address.
	ContextIP
	// ContextReservedIdentity is reserved:kube-apiserver if the endpoint has
	// that label, else its first reserved: label.
	ContextReservedIdentity
	// ContextWorkload is namespace/workload-name.
	ContextWorkload
	// ContextWorkloadName is the workload's name alone.
	ContextWorkloadName
	// ContextApp is the value of the pod's app.kubernetes.io/name, k8s-app
	// or app label.
	ContextApp
)

var contextNames = map[Context]string{
	ContextIdentity:         "identity",
	ContextNamespace:        "namespace",
	ContextPod:              "pod",
	ContextPodName:          "pod-name",
	ContextDNS:              "dns",
	ContextIP:               "ip",
	ContextReservedIdentity: "reserved-identity",
	ContextWorkload:         "workload",
	ContextWorkloadName:     "workload-name",
	ContextApp:              "app",
}

// String returns the context's name in --hubble-metrics.
func (c Context) String() string {
	if s, ok := contextNames[c]; ok {
		return s
	}
	return fmt.Sprintf("context(%d)", uint8(c))
}

// contextOrder lists the context names for error messages.
var contextOrder = []Context{ContextIdentity, ContextNamespace, ContextPod, ContextPodName, ContextDNS, ContextIP,
	ContextReservedIdentity, ContextWorkload, ContextWorkloadName, ContextApp}

func parseContext(s string) (Context, bool) {
	for _, c := range contextOrder {
		if strings.EqualFold(s, contextNames[c]) {
			return c, true
		}
	}
	return 0, false
}

// LabelsContextLabels are the labels labelsContext can add, in the order
// they appear in a metric's label names.
var LabelsContextLabels = []string{
	"source_ip", "source_pod", "source_namespace", "source_workload", "source_workload_kind", "source_app",
	"destination_ip", "destination_pod", "destination_namespace", "destination_workload", "destination_workload_kind", "destination_app",
	"traffic_direction",
}

// ContextOptions say which labels name a flow's source and destination.
// A direction-specific list, when given, replaces the general one for flows
// of that direction; the first context of a list that has a value for the
// flow is used.
type ContextOptions struct {
	Source, SourceEgress, SourceIngress                []Context
	Destination, DestinationEgress, DestinationIngress []Context
	// Labels are labelsContext's labels, in LabelsContextLabels' order.
	Labels []string
}

func (o *ContextOptions) hasSource() bool {
	return len(o.Source)+len(o.SourceEgress)+len(o.SourceIngress) > 0
}

func (o *ContextOptions) hasDestination() bool {
	return len(o.Destination)+len(o.DestinationEgress)+len(o.DestinationIngress) > 0
}

// LabelNames are the labels the options add to a metric, in order.
func (o *ContextOptions) LabelNames() []string {
	names := slices.Clone(o.Labels)
	if o.hasSource() {
		names = append(names, "source")
	}
	if o.hasDestination() {
		names = append(names, "destination")
	}
	return names
}

// Spec is one entry of --hubble-metrics: a metric and its options.
type Spec struct {
	// Name is the metric's name in the list (flow, drop, ...).
	Name string
	// Context is how its labels name sources and destinations.
	Context ContextOptions
}

// contextOptionNames are the options every metric takes, lower-cased.
var contextOptionNames = []string{"sourcecontext", "sourceegresscontext", "sourceingresscontext",
	"destinationcontext", "destinationegresscontext", "destinationingresscontext", "labelscontext"}

const optionsHelp = "sourceContext, sourceEgressContext, sourceIngressContext, destinationContext, destinationEgressContext, destinationIngressContext (values: " +
	"identity|namespace|pod|pod-name|dns|ip|reserved-identity|workload|workload-name|app, several separated by |), labelsContext (labels separated by commas)"

// ParseSpecs parses --hubble-metrics: entries separated by spaces (as
// Cilium's agent takes them) or by commas (as the chart's list is often
// written on one line), each "name" or "name:option=value;option=value".
// The commas inside a labelsContext value belong to that value.
//
// Errors: ErrUnknownMetric for a name cellium does not count; ErrBadOption
// for an unknown, empty, repeated or malformed option. A metric listed twice
// is refused as well.
func ParseSpecs(list string) ([]Spec, error) {
	var specs []Spec
	for _, entry := range splitEntries(list) {
		spec, err := parseSpec(entry)
		if err != nil {
			return nil, err
		}
		if slices.ContainsFunc(specs, func(s Spec) bool { return s.Name == spec.Name }) {
			return nil, fmt.Errorf("metric %q is listed twice: give it once, with all its options", spec.Name)
		}
		specs = append(specs, spec)
	}
	return specs, nil
}

// splitEntries splits the list at spaces and at the commas that do not
// continue a labelsContext value.
func splitEntries(list string) []string {
	var out []string
	for _, field := range strings.Fields(list) {
		for _, tok := range strings.Split(field, ",") {
			if tok == "" {
				continue
			}
			if n := len(out); n > 0 && continuesLabels(out[n-1], tok) {
				out[n-1] += "," + tok
				continue
			}
			out = append(out, tok)
		}
	}
	return out
}

// continuesLabels tells whether tok, after a comma, is another label of
// prev's last option, a labelsContext.
func continuesLabels(prev, tok string) bool {
	_, opts, ok := strings.Cut(prev, ":")
	if !ok {
		return false
	}
	last := opts[strings.LastIndex(opts, ";")+1:]
	name, _, hasValue := strings.Cut(last, "=")
	if !hasValue || !strings.EqualFold(name, "labelsContext") {
		return false
	}
	// A metric's name starts a new entry.
	head, _, _ := strings.Cut(tok, ":")
	return !slices.Contains(knownNames, head) && notCounted[head] == ""
}

func parseSpec(entry string) (Spec, error) {
	name, opts, _ := strings.Cut(entry, ":")
	spec := Spec{Name: name}
	if !slices.Contains(knownNames, name) {
		if why, ok := notCounted[name]; ok {
			return spec, fmt.Errorf("%w %q: %s; the metrics cellium counts are %s", ErrUnknownMetric, name, why, knownNamesList())
		}
		return spec, fmt.Errorf("%w %q: the metrics cellium counts are %s (each optionally followed by :option=value;...)", ErrUnknownMetric, name, knownNamesList())
	}
	seen := map[string]bool{}
	for opt := range strings.SplitSeq(opts, ";") {
		if opt == "" {
			continue
		}
		key, value, _ := strings.Cut(opt, "=")
		lower := strings.ToLower(key)
		if !slices.Contains(contextOptionNames, lower) {
			return spec, fmt.Errorf("%w %q of metric %q: the options are %s", ErrBadOption, key, name, optionsHelp)
		}
		if seen[lower] {
			return spec, fmt.Errorf("%w %q of metric %q: given twice; give it once with every value", ErrBadOption, key, name)
		}
		seen[lower] = true
		if value == "" {
			return spec, fmt.Errorf("%w %q of metric %q: it needs a value (%s=...); the options are %s", ErrBadOption, key, name, key, optionsHelp)
		}
		if lower == "labelscontext" {
			labels, err := parseLabelsContext(value)
			if err != nil {
				return spec, fmt.Errorf("%w labelsContext of metric %q: %w", ErrBadOption, name, err)
			}
			spec.Context.Labels = labels
			continue
		}
		ctxs, err := parseContexts(value)
		if err != nil {
			return spec, fmt.Errorf("%w %s of metric %q: %w", ErrBadOption, key, name, err)
		}
		switch lower {
		case "sourcecontext":
			spec.Context.Source = ctxs
		case "sourceegresscontext":
			spec.Context.SourceEgress = ctxs
		case "sourceingresscontext":
			spec.Context.SourceIngress = ctxs
		case "destinationcontext":
			spec.Context.Destination = ctxs
		case "destinationegresscontext":
			spec.Context.DestinationEgress = ctxs
		case "destinationingresscontext":
			spec.Context.DestinationIngress = ctxs
		}
	}
	return spec, nil
}

func parseContexts(value string) ([]Context, error) {
	var out []Context
	for v := range strings.SplitSeq(value, "|") {
		if v == "" {
			continue
		}
		c, ok := parseContext(v)
		if !ok {
			names := make([]string, len(contextOrder))
			for i, c := range contextOrder {
				names[i] = c.String()
			}
			return nil, fmt.Errorf("unknown context %q: use %s, several separated by |", v, strings.Join(names, ", "))
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no context in %q: use one of identity, namespace, pod, ... separated by |", value)
	}
	return out, nil
}

func parseLabelsContext(value string) ([]string, error) {
	want := map[string]bool{}
	for v := range strings.SplitSeq(value, ",") {
		if v == "" {
			continue
		}
		if !slices.Contains(LabelsContextLabels, v) {
			return nil, fmt.Errorf("unknown label %q: use %s, separated by commas", v, strings.Join(LabelsContextLabels, ", "))
		}
		want[v] = true
	}
	if len(want) == 0 {
		return nil, fmt.Errorf("no label in %q: use %s, separated by commas", value, strings.Join(LabelsContextLabels, ", "))
	}
	var out []string
	for _, l := range LabelsContextLabels {
		if want[l] {
			out = append(out, l)
		}
	}
	return out, nil
}
