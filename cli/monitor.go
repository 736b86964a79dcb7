package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"

	"github.com/cellium/cellium/api/v1/client"
	"github.com/cellium/cellium/api/v1/models"
)

// monitorTypes are the values of --type.
var monitorTypes = []string{models.MonitorTypeDrop, models.MonitorTypeTrace, models.MonitorTypePolicyVerdict}

// monitorSeparator starts each event in verbose output, as in Cilium's.
const monitorSeparator = "------------------------------------------------------------------------------"

func (a *app) monitorCommand() *cobra.Command {
	var types []string
	var relatedTo []string
	var verbose, jsonFlag bool
	cmd := &cobra.Command{
		Use:   "monitor",
		Short: "Print the datapath's events as they happen: drops, policy verdicts, traces",
		Long: `monitor streams the events of this node's eBPF datapath until Ctrl-C:
every dropped packet with its reason in Cilium's words (e.g. Policy denied),
the policy verdict on the first packet of each connection (allow, deny or
audit, with its direction), and traces when the datapath emits them. Each
event names the endpoint, the source and destination identities, the
addresses, ports and protocol.

The lines follow cilium-dbg monitor's formats; -o json prints one JSON
object per line instead. The agent filters by --type and --related-to; an
event the agent could not hand over because this command read too slowly
is counted in a "Lost N events" line.`,
		Example: `  cellium monitor --type drop
  cellium monitor --type policy-verdict --related-to 1234 -o json`,
		Args: cobra.NoArgs,
	}
	cmd.Flags().StringSliceVarP(&types, "type", "t", nil,
		"Only events of this type: "+strings.Join(monitorTypes, ", ")+" (repeat or separate with commas)")
	cmd.Flags().StringSliceVar(&relatedTo, "related-to", nil, "Only events of these endpoint IDs (repeat or separate with commas)")
	cmd.Flags().BoolVarP(&verbose, "verbose", "v", false, "Print each event in the longer, multi-line form")
	cmd.Flags().BoolVarP(&jsonFlag, "json", "j", false, "Same as -o json (cilium-dbg's flag)")
	out := cmd.Flags().StringP("output", "o", "", "Output format: json (one event per line)")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if *out != "" && *out != formatJSON {
			return fmt.Errorf("unknown output format -o %q: monitor prints a stream, use -o json (one event per line)", *out)
		}
		for _, t := range types {
			if !slices.Contains(monitorTypes, t) {
				return fmt.Errorf("unknown --type %q: use %s", t, strings.Join(monitorTypes, ", "))
			}
		}
		var endpoints []uint16
		for _, s := range relatedTo {
			n, err := strconv.ParseUint(s, 10, 16)
			if err != nil || n == 0 {
				return fmt.Errorf("invalid --related-to %q: want an endpoint ID from 1 to 65535 (cellium endpoint list shows them)", s)
			}
			endpoints = append(endpoints, uint16(n))
		}
		return a.monitor(cmd.Context(), types, endpoints, jsonFlag || *out == formatJSON, verbose)
	}
	return cmd
}

// monitor streams events until ctx ends (Ctrl-C), which is a success.
// --timeout bounds only the wait for the agent to answer.
func (a *app) monitor(ctx context.Context, types []string, endpoints []uint16, asJSON, verbose bool) error {
	path, err := socketPath(a.host)
	if err != nil {
		return err
	}
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var timedOut atomic.Bool
	var timer *time.Timer
	if a.timeout > 0 {
		timer = time.AfterFunc(a.timeout, func() { timedOut.Store(true); cancel() })
	}
	c := client.New(path)
	defer c.Close()
	stream, err := c.Monitor(ctx, types, endpoints)
	if timer != nil && !timer.Stop() && timedOut.Load() {
		if stream != nil {
			stream.Close()
		}
		return a.explainTransport(context.DeadlineExceeded, path)
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return a.explainTransport(explain(err, "monitor the datapath", ""), path)
	}
	defer stream.Close()

	w := a.opts.Out
	if !asJSON {
		// On stderr, so that stdout holds only events.
		fmt.Fprintf(a.opts.Err, "Listening for events on unix://%s\nPress Ctrl-C to quit\n", path)
	}
	enc := json.NewEncoder(w)
	for {
		ev, err := stream.Next()
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, io.EOF):
			return errors.New("the agent closed the event stream (is it stopping?): run cellium monitor again once it is back")
		case err != nil:
			return fmt.Errorf("monitor the datapath: %w", err)
		}
		if asJSON {
			err = enc.Encode(ev)
		} else {
			_, err = io.WriteString(w, formatMonitorEvent(&ev, verbose))
		}
		if err != nil {
			return err
		}
	}
}

// formatMonitorEvent renders one event the way cilium-dbg monitor does, as
// far as the event carries the fields (cellium's datapath records no flow
// hash, source file, connection state or original IP: flow is 0x0 and
// file bpf_lxc.c:0 as Cilium prints them when unset). The result ends with
// a newline.
func formatMonitorEvent(ev *models.MonitorEvent, verbose bool) string {
	var b strings.Builder
	summary := connectionSummary(ev)
	switch ev.Type {
	case models.MonitorTypeLost:
		fmt.Fprintf(&b, "Lost %d events\n", ev.Lost)
	case models.MonitorTypeDrop:
		if verbose {
			b.WriteString(monitorSeparator + "\n")
			fmt.Fprintf(&b, "MARK 0x0 FROM %d DROP: %d bytes, reason %s, identity %d->%d", ev.EndpointID, ev.Length,
				ev.Reason, ev.SrcIdentity, ev.DstIdentity)
			if to := toEndpoint(ev); to != 0 {
				fmt.Fprintf(&b, ", to endpoint %d", to)
			}
			fmt.Fprintf(&b, "\n%s, %s, ifindex %d\n", summary, orUnknown(ev.Direction), ev.Ifindex)
			break
		}
		fmt.Fprintf(&b, "xx drop (%s) flow 0x0 to endpoint %d, ifindex %d, file bpf_lxc.c:0, , identity %d->%d: %s\n",
			ev.Reason, toEndpoint(ev), ev.Ifindex, ev.SrcIdentity, ev.DstIdentity, summary)
	case models.MonitorTypePolicyVerdict:
		if verbose {
			b.WriteString(monitorSeparator + "\n")
		}
		remote := ev.SrcIdentity
		if ev.Direction == "egress" {
			remote = ev.DstIdentity
		}
		fmt.Fprintf(&b, "Policy verdict log: flow 0x0 local EP ID %d, remote ID %d, proto %d, %s, action %s, %s\n",
			ev.EndpointID, remote, protocolNumber(ev.Protocol), orUnknown(ev.Direction), ev.Verdict, summary)
	case models.MonitorTypeTrace:
		if verbose {
			b.WriteString(monitorSeparator + "\n")
			fmt.Fprintf(&b, "MARK 0x0 FROM %d %s: %d bytes (0 captured), state unknown", ev.EndpointID, ev.ObservationPoint, ev.Length)
			if ev.Ifindex != 0 {
				fmt.Fprintf(&b, ", interface %d", ev.Ifindex)
			}
			fmt.Fprintf(&b, ", identity %d->%d", ev.SrcIdentity, ev.DstIdentity)
			if ev.ObservationPointCode == traceToEndpoint {
				fmt.Fprintf(&b, ", to endpoint %d", ev.EndpointID)
			}
			fmt.Fprintf(&b, "\n%s\n", summary)
			break
		}
		fmt.Fprintf(&b, "%s flow 0x0 , identity %d->%d state unknown ifindex %d: %s\n",
			traceSummary(ev), ev.SrcIdentity, ev.DstIdentity, ev.Ifindex, summary)
	default:
		fmt.Fprintf(&b, "?? %s event of endpoint %d: %s\n", ev.Type, ev.EndpointID, summary)
	}
	return b.String()
}

// Cilium's trace observation points that name an endpoint.
const (
	traceToEndpoint   = 0
	traceFromEndpoint = 5
)

// traceSummary is Cilium's arrow for an observation point.
func traceSummary(ev *models.MonitorEvent) string {
	switch ev.ObservationPointCode {
	case traceToEndpoint:
		return fmt.Sprintf("-> endpoint %d", ev.EndpointID)
	case 1:
		return "-> proxy"
	case 2:
		return "-> host from"
	case 3:
		return "-> stack"
	case 4:
		return "-> overlay"
	case traceFromEndpoint:
		return fmt.Sprintf("<- endpoint %d", ev.EndpointID)
	case 6:
		return "<- proxy"
	case 7:
		return "<- host"
	case 8:
		return "<- stack"
	case 9:
		return "<- overlay"
	case 10:
		return "<- network"
	case 11:
		return "-> network"
	}
	return "unknown trace"
}

// toEndpoint is the endpoint a drop was going to, as Cilium prints it: the
// endpoint for traffic to it (ingress), 0 otherwise.
func toEndpoint(ev *models.MonitorEvent) uint16 {
	if ev.Direction == "ingress" {
		return ev.EndpointID
	}
	return 0
}

// connectionSummary is Cilium's "10.0.0.2:43210 -> 10.0.0.3:80 tcp" (or
// "10.0.0.2 -> 10.0.0.3 icmp" without ports), then what the event knows
// besides: the TCP flags ("tcp SYN, ACK"), the ICMP type and code ("icmp
// type 8 code 0"), and the Service a socket asked for ("service
// 10.96.0.10:80").
func connectionSummary(ev *models.MonitorEvent) string {
	s := connection(ev)
	switch {
	case ev.TCPFlags != "":
		s += " " + ev.TCPFlags
	case ev.ICMPType != nil && ev.ICMPCode != nil:
		s += fmt.Sprintf(" type %d code %d", *ev.ICMPType, *ev.ICMPCode)
	}
	if ev.OrigDstIP != "" {
		s += " service " + net.JoinHostPort(ev.OrigDstIP, strconv.Itoa(int(ev.OrigDstPort)))
	}
	return s
}

func connection(ev *models.MonitorEvent) string {
	switch {
	case ev.SrcIP == "" && ev.DstIP == "":
		return "[unknown]"
	case ev.Protocol == "tcp" || ev.Protocol == "udp" || ev.Protocol == "sctp":
		return net.JoinHostPort(ev.SrcIP, strconv.Itoa(int(ev.SrcPort))) + " -> " +
			net.JoinHostPort(ev.DstIP, strconv.Itoa(int(ev.DstPort))) + " " + ev.Protocol
	case ev.Protocol != "":
		return ev.SrcIP + " -> " + ev.DstIP + " " + ev.Protocol
	}
	return ev.SrcIP + " -> " + ev.DstIP
}

// protocolNumber turns the event's protocol name back into its number.
func protocolNumber(p string) int {
	switch p {
	case "icmp":
		return 1
	case "tcp":
		return 6
	case "udp":
		return 17
	case "icmpv6":
		return 58
	case "sctp":
		return 132
	}
	n, _ := strconv.Atoi(p)
	return n
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}
