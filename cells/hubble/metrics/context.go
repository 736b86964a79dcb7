package metrics

import (
	"strings"

	flowpb "github.com/cilium/cilium/api/v1/flow"
)

// internLimit bounds each intern cache; a full cache is emptied and refilled.
const internLimit = 4096

// interner keeps the "a/b" strings made from two others, so that a label
// value built from a flow's namespace and pod (or workload) name is
// allocated once, not once per flow.
type interner map[[2]string]string

func (in interner) join(a, b string) string {
	k := [2]string{a, b}
	if s, ok := in[k]; ok {
		return s
	}
	if len(in) >= internLimit {
		clear(in)
	}
	s := a + "/" + b
	in[k] = s
	return s
}

// labeler writes the context labels of one metric's options.
type labeler struct {
	opts   ContextOptions
	src    bool
	dst    bool
	n      int
	intern interner
}

func newLabeler(opts ContextOptions) *labeler {
	l := &labeler{opts: opts, src: opts.hasSource(), dst: opts.hasDestination(), intern: interner{}}
	l.n = len(l.opts.LabelNames())
	return l
}

// fill writes the context label values of f into dst, which has room for
// exactly the context's labels.
func (l *labeler) fill(dst []string, f *flowpb.Flow) {
	i := 0
	for _, name := range l.opts.Labels {
		dst[i] = l.labelValue(name, f)
		i++
	}
	dir := f.GetTrafficDirection()
	if l.src {
		ctxs := l.opts.Source
		switch {
		case dir == flowpb.TrafficDirection_INGRESS && l.opts.SourceIngress != nil:
			ctxs = l.opts.SourceIngress
		case dir == flowpb.TrafficDirection_EGRESS && l.opts.SourceEgress != nil:
			ctxs = l.opts.SourceEgress
		}
		dst[i] = l.first(ctxs, f, true)
		i++
	}
	if l.dst {
		ctxs := l.opts.Destination
		switch {
		case dir == flowpb.TrafficDirection_INGRESS && l.opts.DestinationIngress != nil:
			ctxs = l.opts.DestinationIngress
		case dir == flowpb.TrafficDirection_EGRESS && l.opts.DestinationEgress != nil:
			ctxs = l.opts.DestinationEgress
		}
		dst[i] = l.first(ctxs, f, false)
	}
}

// first is the value of the first context that has one for the endpoint.
func (l *labeler) first(ctxs []Context, f *flowpb.Flow, source bool) string {
	for _, c := range ctxs {
		if v := l.contextValue(c, f, source); v != "" {
			return v
		}
	}
	return ""
}

func (l *labeler) contextValue(c Context, f *flowpb.Flow, source bool) string {
	ep := f.GetDestination()
	if source {
		ep = f.GetSource()
	}
	switch c {
	case ContextNamespace:
		return ep.GetNamespace()
	case ContextIdentity:
		return joinComma(ep.GetLabels())
	case ContextPod:
		if ep.GetNamespace() == "" {
			return ep.GetPodName()
		}
		return l.intern.join(ep.GetNamespace(), ep.GetPodName())
	case ContextPodName:
		return ep.GetPodName()
	case ContextDNS:
		if source {
			return joinComma(f.GetSourceNames())
		}
		return joinComma(f.GetDestinationNames())
	case ContextIP:
		if source {
			return f.GetIP().GetSource()
		}
		return f.GetIP().GetDestination()
	case ContextReservedIdentity:
		return reservedIdentity(ep.GetLabels())
	case ContextWorkload:
		name := workloadName(ep)
		if name == "" || ep.GetNamespace() == "" {
			return name
		}
		return l.intern.join(ep.GetNamespace(), name)
	case ContextWorkloadName:
		return workloadName(ep)
	case ContextApp:
		return appLabel(ep.GetLabels())
	}
	return ""
}

func (l *labeler) labelValue(name string, f *flowpb.Flow) string {
	src, dst := f.GetSource(), f.GetDestination()
	switch name {
	case "source_ip":
		return f.GetIP().GetSource()
	case "source_pod":
		return src.GetPodName()
	case "source_namespace":
		return src.GetNamespace()
	case "source_workload":
		return workloadName(src)
	case "source_workload_kind":
		return workloadKind(src)
	case "source_app":
		return appLabel(src.GetLabels())
	case "destination_ip":
		return f.GetIP().GetDestination()
	case "destination_pod":
		return dst.GetPodName()
	case "destination_namespace":
		return dst.GetNamespace()
	case "destination_workload":
		return workloadName(dst)
	case "destination_workload_kind":
		return workloadKind(dst)
	case "destination_app":
		return appLabel(dst.GetLabels())
	case "traffic_direction":
		switch f.GetTrafficDirection() {
		case flowpb.TrafficDirection_INGRESS:
			return "ingress"
		case flowpb.TrafficDirection_EGRESS:
			return "egress"
		}
		return "unknown"
	}
	return ""
}

// joinComma joins with commas, allocating only for two values or more.
func joinComma(s []string) string {
	switch len(s) {
	case 0:
		return ""
	case 1:
		return s[0]
	}
	return strings.Join(s, ",")
}

func workloadName(ep *flowpb.Endpoint) string {
	if w := ep.GetWorkloads(); len(w) > 0 {
		return w[0].GetName()
	}
	return ""
}

func workloadKind(ep *flowpb.Endpoint) string {
	if w := ep.GetWorkloads(); len(w) > 0 {
		return w[0].GetKind()
	}
	return ""
}

const kubeAPIServerLabel = "reserved:kube-apiserver"

// reservedIdentity is reserved:kube-apiserver if present, else the first
// reserved: label.
func reservedIdentity(labels []string) string {
	first := ""
	for _, l := range labels {
		if l == kubeAPIServerLabel {
			return l
		}
		if first == "" && strings.HasPrefix(l, "reserved:") {
			first = l
		}
	}
	return first
}

// appLabelKeys are the pod labels that name an application, as an
// endpoint's labels spell them (source "k8s").
var appLabelKeys = []string{"k8s:app.kubernetes.io/name=", "k8s:k8s-app=", "k8s:app="}

// appLabel is the value of the first of the endpoint's labels that is an
// application label with a value.
func appLabel(labels []string) string {
	for _, l := range labels {
		for _, k := range appLabelKeys {
			if v, ok := strings.CutPrefix(l, k); ok && v != "" {
				return v
			}
		}
	}
	return ""
}
