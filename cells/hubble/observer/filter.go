package observer

import (
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	k8slabels "k8s.io/apimachinery/pkg/labels"
)

// match tells whether a flow passes one part of a FlowFilter.
type match func(*flowpb.Flow) bool

// flowFilter is one FlowFilter compiled: a flow matches when every part
// matches.
type flowFilter []match

func (ff flowFilter) matches(f *flowpb.Flow) bool {
	for _, m := range ff {
		if !m(f) {
			return false
		}
	}
	return true
}

// filterList is a whitelist or a blacklist: a flow matches when any of
// its filters matches.
type filterList []flowFilter

func (fl filterList) any(f *flowpb.Flow) bool {
	for _, ff := range fl {
		if ff.matches(f) {
			return true
		}
	}
	return false
}

// accepts reports whether a flow passes a request's whitelist (none means
// everything) and blacklist.
func accepts(white, black filterList, f *flowpb.Flow) bool {
	if len(white) > 0 && !white.any(f) {
		return false
	}
	return !black.any(f)
}

// builder compiles the fields of a FlowFilter it implements; a field set
// in a request that has no builder is refused with codes.Unimplemented.
type builder func(ff *flowpb.FlowFilter) (match, error)

// builders maps FlowFilter field names (protobuf names) to their builder.
var builders = map[protoreflect.Name]builder{
	"source_ip":      func(ff *flowpb.FlowFilter) (match, error) { return ipMatch(ff.GetSourceIp(), srcIP) },
	"destination_ip": func(ff *flowpb.FlowFilter) (match, error) { return ipMatch(ff.GetDestinationIp(), dstIP) },
	"source_pod": func(ff *flowpb.FlowFilter) (match, error) {
		return nameMatch(ff.GetSourcePod(), func(f *flowpb.Flow) (string, string) {
			return f.GetSource().GetNamespace(), f.GetSource().GetPodName()
		})
	},
	"destination_pod": func(ff *flowpb.FlowFilter) (match, error) {
		return nameMatch(ff.GetDestinationPod(), func(f *flowpb.Flow) (string, string) {
			return f.GetDestination().GetNamespace(), f.GetDestination().GetPodName()
		})
	},
	"source_service": func(ff *flowpb.FlowFilter) (match, error) {
		return nameMatch(ff.GetSourceService(), func(f *flowpb.Flow) (string, string) {
			return f.GetSourceService().GetNamespace(), f.GetSourceService().GetName()
		})
	},
	"destination_service": func(ff *flowpb.FlowFilter) (match, error) {
		return nameMatch(ff.GetDestinationService(), func(f *flowpb.Flow) (string, string) {
			return f.GetDestinationService().GetNamespace(), f.GetDestinationService().GetName()
		})
	},
	"source_label": func(ff *flowpb.FlowFilter) (match, error) {
		return labelMatch(ff.GetSourceLabel(), func(f *flowpb.Flow) []string { return f.GetSource().GetLabels() })
	},
	"destination_label": func(ff *flowpb.FlowFilter) (match, error) {
		return labelMatch(ff.GetDestinationLabel(), func(f *flowpb.Flow) []string { return f.GetDestination().GetLabels() })
	},
	"node_labels": func(ff *flowpb.FlowFilter) (match, error) {
		return labelMatch(ff.GetNodeLabels(), func(f *flowpb.Flow) []string { return f.GetNodeLabels() })
	},
	"source_workload": func(ff *flowpb.FlowFilter) (match, error) {
		return workloadMatch(ff.GetSourceWorkload(), func(f *flowpb.Flow) []*flowpb.Workload { return f.GetSource().GetWorkloads() })
	},
	"destination_workload": func(ff *flowpb.FlowFilter) (match, error) {
		return workloadMatch(ff.GetDestinationWorkload(), func(f *flowpb.Flow) []*flowpb.Workload { return f.GetDestination().GetWorkloads() })
	},
	"source_identity": func(ff *flowpb.FlowFilter) (match, error) {
		ids := ff.GetSourceIdentity()
		return func(f *flowpb.Flow) bool { return slices.Contains(ids, f.GetSource().GetIdentity()) }, nil
	},
	"destination_identity": func(ff *flowpb.FlowFilter) (match, error) {
		ids := ff.GetDestinationIdentity()
		return func(f *flowpb.Flow) bool { return slices.Contains(ids, f.GetDestination().GetIdentity()) }, nil
	},
	"verdict": func(ff *flowpb.FlowFilter) (match, error) {
		vs := ff.GetVerdict()
		return func(f *flowpb.Flow) bool { return slices.Contains(vs, f.GetVerdict()) }, nil
	},
	"drop_reason_desc": func(ff *flowpb.FlowFilter) (match, error) {
		rs := ff.GetDropReasonDesc()
		return func(f *flowpb.Flow) bool {
			return f.GetVerdict() == flowpb.Verdict_DROPPED && slices.Contains(rs, f.GetDropReasonDesc())
		}, nil
	},
	"traffic_direction": func(ff *flowpb.FlowFilter) (match, error) {
		ds := ff.GetTrafficDirection()
		return func(f *flowpb.Flow) bool { return slices.Contains(ds, f.GetTrafficDirection()) }, nil
	},
	"event_type": func(ff *flowpb.FlowFilter) (match, error) { return eventTypeMatch(ff.GetEventType()), nil },
	"protocol":   func(ff *flowpb.FlowFilter) (match, error) { return protocolMatch(ff.GetProtocol()) },
	"source_port": func(ff *flowpb.FlowFilter) (match, error) {
		return portMatch("source", ff.GetSourcePort(), func(l4 *flowpb.Layer4) (uint32, bool) {
			switch {
			case l4.GetTCP() != nil:
				return l4.GetTCP().GetSourcePort(), true
			case l4.GetUDP() != nil:
				return l4.GetUDP().GetSourcePort(), true
			case l4.GetSCTP() != nil:
				return l4.GetSCTP().GetSourcePort(), true
			}
			return 0, false
		})
	},
	"destination_port": func(ff *flowpb.FlowFilter) (match, error) {
		return portMatch("destination", ff.GetDestinationPort(), func(l4 *flowpb.Layer4) (uint32, bool) {
			switch {
			case l4.GetTCP() != nil:
				return l4.GetTCP().GetDestinationPort(), true
			case l4.GetUDP() != nil:
				return l4.GetUDP().GetDestinationPort(), true
			case l4.GetSCTP() != nil:
				return l4.GetSCTP().GetDestinationPort(), true
			}
			return 0, false
		})
	},
	"tcp_flags": func(ff *flowpb.FlowFilter) (match, error) { return tcpFlagsMatch(ff.GetTcpFlags()), nil },
	"reply": func(ff *flowpb.FlowFilter) (match, error) {
		want := ff.GetReply()
		return func(f *flowpb.Flow) bool {
			// A flow whose direction is unknown is neither, except a drop
			// (its packet was never answered), which counts as a request.
			if f.GetIsReply() == nil && f.GetVerdict() != flowpb.Verdict_DROPPED {
				return false
			}
			return slices.Contains(want, f.GetIsReply().GetValue())
		}, nil
	},
	"node_name": func(ff *flowpb.FlowFilter) (match, error) { return nodeNameMatch(ff.GetNodeName()) },
	"ip_version": func(ff *flowpb.FlowFilter) (match, error) {
		vs := ff.GetIpVersion()
		return func(f *flowpb.Flow) bool { return f.GetIP() != nil && slices.Contains(vs, f.GetIP().GetIpVersion()) }, nil
	},
}

// compileFilters compiles a whitelist or blacklist.
//
// Errors: codes.Unimplemented naming a set field this agent does not
// filter on; codes.InvalidArgument for a malformed value.
func compileFilters(list []*flowpb.FlowFilter) (filterList, error) {
	out := make(filterList, 0, len(list))
	for _, ff := range list {
		var compiled flowFilter
		var err error
		ff.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, _ protoreflect.Value) bool {
			b, ok := builders[fd.Name()]
			if !ok {
				err = status.Errorf(codes.Unimplemented, "the flow filter field %s is not implemented by this agent: drop the flag that sets it", fd.Name())
				return false
			}
			var m match
			if m, err = b(ff); err != nil {
				err = status.Errorf(codes.InvalidArgument, "invalid %s filter: %v", fd.Name(), err)
				return false
			}
			compiled = append(compiled, m)
			return true
		})
		if err != nil {
			return nil, err
		}
		out = append(out, compiled)
	}
	return out, nil
}

// Unimplemented lists the FlowFilter fields compileFilters refuses.
func Unimplemented() []string {
	var out []string
	fields := (&flowpb.FlowFilter{}).ProtoReflect().Descriptor().Fields()
	for i := range fields.Len() {
		if _, ok := builders[fields.Get(i).Name()]; !ok {
			out = append(out, string(fields.Get(i).Name()))
		}
	}
	return out
}

func srcIP(f *flowpb.Flow) string { return f.GetIP().GetSource() }
func dstIP(f *flowpb.Flow) string { return f.GetIP().GetDestination() }

// ipMatch matches addresses and prefixes ("10.0.0.1", "10.0.0.0/8").
func ipMatch(values []string, get func(*flowpb.Flow) string) (match, error) {
	var addrs []netip.Addr
	var prefixes []netip.Prefix
	for _, v := range values {
		if strings.Contains(v, "/") {
			p, err := netip.ParsePrefix(v)
			if err != nil {
				return nil, fmt.Errorf("%q is not an IP prefix: %w", v, err)
			}
			prefixes = append(prefixes, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(v)
		if err != nil {
			return nil, fmt.Errorf("%q is not an IP address: %w", v, err)
		}
		addrs = append(addrs, a)
	}
	return func(f *flowpb.Flow) bool {
		a, err := netip.ParseAddr(get(f))
		if err != nil {
			return false
		}
		if slices.Contains(addrs, a) {
			return true
		}
		return slices.ContainsFunc(prefixes, func(p netip.Prefix) bool { return p.Contains(a) })
	}, nil
}

// nameMatch matches "namespace/name-prefix", "namespace/" (every name of
// the namespace) and "name-prefix" (in namespace default), as Hubble does
// for pods and services.
func nameMatch(values []string, get func(*flowpb.Flow) (ns, name string)) (match, error) {
	type nsName struct{ ns, prefix string }
	var want []nsName
	for _, v := range values {
		if v == "" {
			return nil, fmt.Errorf("a name must not be empty")
		}
		ns, name, ok := strings.Cut(v, "/")
		if !ok {
			ns, name = "default", v
		}
		want = append(want, nsName{ns, name})
	}
	return func(f *flowpb.Flow) bool {
		ns, name := get(f)
		if ns == "" && name == "" {
			return false
		}
		for _, w := range want {
			if (w.ns == "" || w.ns == ns) && strings.HasPrefix(name, w.prefix) {
				return true
			}
		}
		return false
	}, nil
}

// labelMatch matches label selectors ("app=web", "k8s:app in (a,b)",
// "!reserved:host") against Cilium-style labels ("source:key=value"). A
// key without a source matches any source.
func labelMatch(selectors []string, get func(*flowpb.Flow) []string) (match, error) {
	var sels []k8slabels.Selector
	for _, s := range selectors {
		sel, err := k8slabels.Parse(selectorKeys(s))
		if err != nil {
			return nil, fmt.Errorf("label selector %q: %w", s, err)
		}
		sels = append(sels, sel)
	}
	return func(f *flowpb.Flow) bool {
		lbls := flowLabels(get(f))
		for _, s := range sels {
			if s.Matches(lbls) {
				return true
			}
		}
		return false
	}, nil
}

// selectorKeys rewrites each key of a selector from "source:key" (or
// "key", meaning any source) to "source.key", a valid Kubernetes label
// key that flowLabels understands.
func selectorKeys(sel string) string {
	var b strings.Builder
	atKey := true
	depth := 0
	for i := 0; i < len(sel); {
		c := sel[i]
		switch {
		case atKey && (c == ' ' || c == '!'):
			b.WriteByte(c)
			i++
		case atKey:
			end := strings.IndexAny(sel[i:], " =!,")
			if end < 0 {
				end = len(sel) - i
			}
			key := sel[i : i+end]
			if src, k, ok := strings.Cut(key, ":"); ok {
				key = src + "." + k
			} else {
				key = "any." + key
			}
			b.WriteString(key)
			i += end
			atKey = false
		default:
			switch c {
			case '(':
				depth++
			case ')':
				depth--
			}
			b.WriteByte(c)
			i++
			if c == ',' && depth == 0 {
				atKey = true
			}
		}
	}
	return b.String()
}

// flowLabels are a flow endpoint's labels seen by a translated selector.
type flowLabels []string

func (l flowLabels) lookup(key string) (string, bool) {
	src, k, _ := strings.Cut(key, ".")
	for _, lbl := range l {
		lsrc, rest, ok := strings.Cut(lbl, ":")
		if !ok {
			lsrc, rest = "unspec", lbl
		}
		lk, lv, _ := strings.Cut(rest, "=")
		if lk == k && (src == "any" || src == lsrc) {
			return lv, true
		}
	}
	return "", false
}

// Has implements labels.Labels.
func (l flowLabels) Has(key string) bool { _, ok := l.lookup(key); return ok }

// Get implements labels.Labels.
func (l flowLabels) Get(key string) string { v, _ := l.lookup(key); return v }

// Lookup implements labels.Labels.
func (l flowLabels) Lookup(key string) (string, bool) { return l.lookup(key) }

func workloadMatch(want []*flowpb.Workload, get func(*flowpb.Flow) []*flowpb.Workload) (match, error) {
	return func(f *flowpb.Flow) bool {
		for _, have := range get(f) {
			for _, w := range want {
				if (w.GetKind() == "" || w.GetKind() == have.GetKind()) && (w.GetName() == "" || w.GetName() == have.GetName()) {
					return true
				}
			}
		}
		return false
	}, nil
}

func eventTypeMatch(types []*flowpb.EventTypeFilter) match {
	return func(f *flowpb.Flow) bool {
		et := f.GetEventType()
		if et == nil {
			return false
		}
		for _, t := range types {
			if t.GetType() != 0 && t.GetType() != et.GetType() {
				continue
			}
			if t.GetMatchSubType() && t.GetSubType() != et.GetSubType() {
				continue
			}
			return true
		}
		return false
	}
}

func protocolMatch(protos []string) (match, error) {
	var want []func(*flowpb.Flow) bool
	for _, p := range protos {
		var m func(*flowpb.Flow) bool
		switch strings.ToLower(p) {
		case "tcp":
			m = func(f *flowpb.Flow) bool { return f.GetL4().GetTCP() != nil }
		case "udp":
			m = func(f *flowpb.Flow) bool { return f.GetL4().GetUDP() != nil }
		case "sctp":
			m = func(f *flowpb.Flow) bool { return f.GetL4().GetSCTP() != nil }
		case "icmp":
			m = func(f *flowpb.Flow) bool { return f.GetL4().GetICMPv4() != nil || f.GetL4().GetICMPv6() != nil }
		case "icmpv4":
			m = func(f *flowpb.Flow) bool { return f.GetL4().GetICMPv4() != nil }
		case "icmpv6":
			m = func(f *flowpb.Flow) bool { return f.GetL4().GetICMPv6() != nil }
		case "vrrp":
			m = func(f *flowpb.Flow) bool { return f.GetL4().GetVRRP() != nil }
		case "igmp":
			m = func(f *flowpb.Flow) bool { return f.GetL4().GetIGMP() != nil }
		case "http":
			m = func(f *flowpb.Flow) bool { return f.GetL7().GetHttp() != nil }
		case "dns":
			m = func(f *flowpb.Flow) bool { return f.GetL7().GetDns() != nil }
		default:
			return nil, fmt.Errorf("unknown protocol %q: use tcp, udp, sctp, icmp, icmpv4, icmpv6, vrrp, igmp, http or dns", p)
		}
		want = append(want, m)
	}
	return func(f *flowpb.Flow) bool {
		for _, m := range want {
			if m(f) {
				return true
			}
		}
		return false
	}, nil
}

func portMatch(which string, values []string, get func(*flowpb.Layer4) (uint32, bool)) (match, error) {
	var ports []uint32
	for _, v := range values {
		p, err := strconv.ParseUint(v, 10, 16)
		if err != nil {
			return nil, fmt.Errorf("%s port %q is not a port number from 0 to 65535", which, v)
		}
		ports = append(ports, uint32(p))
	}
	return func(f *flowpb.Flow) bool {
		p, ok := get(f.GetL4())
		return ok && slices.Contains(ports, p)
	}, nil
}

// tcpFlagsMatch matches a flow that has every flag of one of the sets.
func tcpFlagsMatch(sets []*flowpb.TCPFlags) match {
	return func(f *flowpb.Flow) bool {
		have := f.GetL4().GetTCP().GetFlags()
		if have == nil {
			return false
		}
		for _, w := range sets {
			if (!w.FIN || have.FIN) && (!w.SYN || have.SYN) && (!w.RST || have.RST) &&
				(!w.PSH || have.PSH) && (!w.ACK || have.ACK) && (!w.URG || have.URG) &&
				(!w.ECE || have.ECE) && (!w.CWR || have.CWR) && (!w.NS || have.NS) {
				return true
			}
		}
		return false
	}
}

// nodeNameMatch matches "node", "cluster/node" and glob patterns ("kind-*")
// against the flow's node name, which is "cluster/node" or, in the default
// cluster, "node".
func nodeNameMatch(patterns []string) (match, error) {
	var alts []string
	for _, p := range patterns {
		cluster, node, ok := strings.Cut(p, "/")
		if !ok {
			cluster, node = "", p
		}
		if strings.Contains(node, "/") {
			return nil, fmt.Errorf("node name pattern %q has more than one /: use node or cluster/node", p)
		}
		if p == "" {
			return nil, fmt.Errorf("a node name pattern must not be empty")
		}
		alts = append(alts, globRE(cluster)+"/"+globRE(node))
	}
	re, err := regexp.Compile(`\A(?:` + strings.Join(alts, "|") + `)\z`)
	if err != nil {
		return nil, fmt.Errorf("node name patterns %q: %w", patterns, err)
	}
	return func(f *flowpb.Flow) bool {
		n := f.GetNodeName()
		if n == "" {
			return false
		}
		if !strings.Contains(n, "/") {
			n = "default/" + n
		}
		return re.MatchString(n)
	}, nil
}

// globRE turns a pattern where * is any run of name characters into a
// regular expression; an empty pattern matches any name.
func globRE(p string) string {
	if p == "" {
		return `[^/]*`
	}
	parts := strings.Split(strings.ToLower(strings.TrimSuffix(p, ".")), "*")
	for i := range parts {
		parts[i] = regexp.QuoteMeta(parts[i])
	}
	return strings.Join(parts, `[^/]*`)
}
