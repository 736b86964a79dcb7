package observer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	observerpb "github.com/cilium/cilium/api/v1/observer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/cellium/cellium/cells/hubble"
)

// Server implements Hubble's observer.Observer service over a Ring.
type Server struct {
	observerpb.UnimplementedObserverServer
	stopper
	ring     *Ring
	nodeName string
	version  string
	start    time.Time
	log      *slog.Logger
	// lostInterval bounds how often a stream gets a HUBBLE_RING_BUFFER
	// LostEvent.
	lostInterval time.Duration
}

// ServerOption changes a Server's defaults.
type ServerOption func(*Server)

// WithLostEventSendInterval makes each GetFlows stream send at most one
// HUBBLE_RING_BUFFER LostEvent per d, summing the flows it missed in it
// (--hubble-lost-event-send-interval; the default is
// hubble.DefaultLostEventSendInterval).
func WithLostEventSendInterval(d time.Duration) ServerOption {
	return func(s *Server) { s.lostInterval = d }
}

// NewServer serves ring as node nodeName ("node", or "cluster/node"
// outside the default cluster); version is what ServerStatus reports.
func NewServer(ring *Ring, nodeName, version string, log *slog.Logger, opts ...ServerOption) *Server {
	s := &Server{stopper: newStopper(), ring: ring, nodeName: nodeName, version: version, start: time.Now(), log: log,
		lostInterval: hubble.DefaultLostEventSendInterval}
	for _, o := range opts {
		o(s)
	}
	return s
}

// ServerStatus implements observer.ObserverServer: the ring's fill, the
// flows seen since start, uptime and version. NumConnectedNodes and
// NumUnavailableNodes stay unset, as on Cilium's agent (they are the
// relay's).
func (s *Server) ServerStatus(context.Context, *observerpb.ServerStatusRequest) (*observerpb.ServerStatusResponse, error) {
	return &observerpb.ServerStatusResponse{
		Version:   s.version,
		NumFlows:  s.ring.Len(),
		MaxFlows:  s.ring.Cap(),
		SeenFlows: s.ring.SeenFlows(),
		UptimeNs:  uint64(time.Since(s.start).Nanoseconds()),
		FlowsRate: s.flowRate(time.Now()),
	}, nil
}

// flowRate is the flows per second of the last minute, from the ring.
func (s *Server) flowRate(now time.Time) float64 {
	const window = time.Minute
	end := s.ring.Written()
	oldest := s.ring.oldest()
	n := 0
	for seq := end; seq > oldest; seq-- {
		e, ok, _ := s.ring.at(seq - 1)
		if !ok {
			break
		}
		if e.flow == nil {
			continue
		}
		if t := e.time(); !t.IsZero() && now.Sub(t) > window {
			break
		}
		n++
	}
	return float64(n) / window.Seconds()
}

// GetNodes implements observer.ObserverServer. As on Cilium's agent it is
// not implemented: hubble-relay answers it (`hubble list nodes`).
func (s *Server) GetNodes(context.Context, *observerpb.GetNodesRequest) (*observerpb.GetNodesResponse, error) {
	return nil, status.Error(codes.Unimplemented, "GetNodes is answered by hubble-relay, not by an agent: point the hubble CLI at the relay (--server <relay>:4245)")
}

// GetNamespaces implements observer.ObserverServer: the namespaces of the
// flows the ring holds now.
func (s *Server) GetNamespaces(context.Context, *observerpb.GetNamespacesRequest) (*observerpb.GetNamespacesResponse, error) {
	seen := map[string]bool{}
	end := s.ring.Written()
	for seq := s.ring.oldest(); seq < end; seq++ {
		e, ok, _ := s.ring.at(seq)
		if !ok || e.flow == nil {
			continue
		}
		for _, ns := range []string{e.flow.GetSource().GetNamespace(), e.flow.GetDestination().GetNamespace()} {
			if ns != "" {
				seen[ns] = true
			}
		}
	}
	cluster := ""
	if c, _, ok := strings.Cut(s.nodeName, "/"); ok {
		cluster = c
	}
	out := &observerpb.GetNamespacesResponse{}
	for _, ns := range slices.Sorted(func(yield func(string) bool) {
		for ns := range seen {
			if !yield(ns) {
				return
			}
		}
	}) {
		out.Namespaces = append(out.Namespaces, &observerpb.Namespace{Namespace: ns, Cluster: cluster})
	}
	return out, nil
}

// GetAgentEvents implements observer.ObserverServer. cellium records no
// agent events in the ring, so the stream is empty (and, with follow,
// stays open until the client leaves).
func (s *Server) GetAgentEvents(req *observerpb.GetAgentEventsRequest, stream observerpb.Observer_GetAgentEventsServer) error {
	return s.emptyEvents(stream.Context(), req.GetFirst(), req.GetFollow())
}

// GetDebugEvents implements observer.ObserverServer: as GetAgentEvents,
// cellium records no debug events.
func (s *Server) GetDebugEvents(req *observerpb.GetDebugEventsRequest, stream observerpb.Observer_GetDebugEventsServer) error {
	return s.emptyEvents(stream.Context(), req.GetFirst(), req.GetFollow())
}

// emptyEvents answers a request for events cellium does not record: none,
// and with follow, a stream that stays open until the client leaves or the
// server stops.
func (s *Server) emptyEvents(ctx context.Context, first, follow bool) error {
	if first && follow {
		return status.Error(codes.InvalidArgument, "first cannot be specified with follow")
	}
	if follow {
		ctx, release := s.streamContext(ctx)
		defer release()
		<-ctx.Done()
	}
	return nil
}

// flowsQuery is a validated GetFlowsRequest.
type flowsQuery struct {
	white, black filterList
	number       uint64
	first        bool
	follow       bool
	since, until time.Time // zero: unset
	mask         [][]protoreflect.Name
}

// parseFlowsRequest validates a request.
//
// Errors: codes.InvalidArgument for contradicting or malformed fields,
// codes.Unimplemented for a filter field or request field not served.
func parseFlowsRequest(req *observerpb.GetFlowsRequest) (*flowsQuery, error) {
	q := &flowsQuery{number: req.GetNumber(), first: req.GetFirst(), follow: req.GetFollow()}
	if q.first && q.follow {
		return nil, status.Error(codes.InvalidArgument, "first cannot be specified with follow")
	}
	for _, ts := range []struct {
		name string
		ts   *timestamppb.Timestamp
		dst  *time.Time
	}{{"since", req.GetSince(), &q.since}, {"until", req.GetUntil(), &q.until}} {
		if ts.ts == nil {
			continue
		}
		if err := ts.ts.CheckValid(); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "invalid %s timestamp: %v", ts.name, err)
		}
		*ts.dst = ts.ts.AsTime()
	}
	if !q.since.IsZero() && !q.until.IsZero() && q.since.After(q.until) {
		return nil, status.Errorf(codes.InvalidArgument, "since (%s) is after until (%s): give a since that is before until",
			q.since.Format(time.RFC3339Nano), q.until.Format(time.RFC3339Nano))
	}
	if req.GetExtensions() != nil {
		return nil, status.Errorf(codes.Unimplemented, "request extensions (%s) are not implemented by this agent", req.GetExtensions().GetTypeUrl())
	}
	if fm := req.GetFieldMask(); len(fm.GetPaths()) > 0 {
		if !fm.IsValid(&flowpb.Flow{}) {
			return nil, status.Errorf(codes.InvalidArgument, "invalid field mask %v: every path must name a field of flow.Flow", fm.GetPaths())
		}
		for _, p := range fieldmaskpb.Union(fm, &fieldmaskpb.FieldMask{}).GetPaths() {
			var names []protoreflect.Name
			for n := range strings.SplitSeq(p, ".") {
				names = append(names, protoreflect.Name(n))
			}
			q.mask = append(q.mask, names)
		}
	}
	var err error
	if q.white, err = compileFilters(req.GetWhitelist()); err != nil {
		return nil, err
	}
	if q.black, err = compileFilters(req.GetBlacklist()); err != nil {
		return nil, err
	}
	return q, nil
}

// GetFlows implements observer.ObserverServer: the flows of the ring that
// pass the filters, the last `number` ones (or the first with first,
// from since, up to until), then with follow every new one. A reader that
// falls behind by more than the ring holds gets a LostEvent with source
// HUBBLE_RING_BUFFER saying how many it missed: at most one per
// lostInterval, summing the interval's gaps, as Hubble (and the pending
// count before a stream without follow ends). A number larger than the
// ring (hubble observe --all asks for 2^64-1) means everything it holds.
func (s *Server) GetFlows(req *observerpb.GetFlowsRequest, stream observerpb.Observer_GetFlowsServer) error {
	q, err := parseFlowsRequest(req)
	if err != nil {
		return err
	}
	ctx, release := s.streamContext(stream.Context())
	defer release()
	end := s.ring.Written() // without follow, the stream ends here
	start := s.startSeq(q, end)
	rd := s.ring.NewReader(start)
	var sent uint64
	missed := hubble.NewLostCounter(flowpb.LostEventSource_HUBBLE_RING_BUFFER, s.lostInterval)
	// sendMissed sends the flows missed as one LostEvent when due (or,
	// with force, when any).
	sendMissed := func(force bool) error {
		if missed.Pending() == 0 || (!force && !missed.Due(time.Now())) {
			return nil
		}
		return stream.Send(s.lostResponse(missed.Take()))
	}
	// finish ends a stream without follow: what it missed, then EOF.
	finish := func() error { return sendMissed(true) }
	for {
		if !q.follow && rd.next >= end {
			return finish()
		}
		var e *event
		var lost uint64
		if q.follow {
			e, lost, err = s.nextFollow(ctx, rd, missed)
			if err != nil {
				if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
					return nil
				}
				return err
			}
		} else {
			var ok bool
			if e, lost, ok = rd.Next(); !ok {
				return finish()
			}
		}
		missed.Add(lost, time.Now())
		if err := sendMissed(false); err != nil {
			return err
		}
		if e == nil { // the wait ended for a due LostEvent
			continue
		}
		if e.seq >= end && !q.follow {
			return finish()
		}
		if e.lost != nil {
			if err := stream.Send(s.lostResponse(e.lost)); err != nil {
				return err
			}
			continue
		}
		t := e.time()
		if !q.since.IsZero() && t.Before(q.since) {
			continue
		}
		if !q.until.IsZero() && t.After(q.until) {
			if q.follow {
				continue
			}
			return finish()
		}
		if !accepts(q.white, q.black, e.flow) {
			continue
		}
		f := e.flow
		if q.mask != nil {
			f = applyMask(f, q.mask)
		}
		if err := stream.Send(&observerpb.GetFlowsResponse{
			Time:          f.GetTime(),
			NodeName:      e.flow.GetNodeName(),
			ResponseTypes: &observerpb.GetFlowsResponse_Flow{Flow: f},
		}); err != nil {
			return err
		}
		sent++
		// With follow, number only says how far back to start.
		if !q.follow && q.number > 0 && sent >= q.number {
			return finish()
		}
	}
}

// nextFollow waits for the next event of a follow stream; while missed
// flows wait to be reported it waits no longer than until they are due,
// then returns no event (nil, 0, nil).
//
// Errors: ctx's error when it ends first.
func (s *Server) nextFollow(ctx context.Context, rd *Reader, missed *hubble.LostCounter) (*event, uint64, error) {
	due := missed.DueAt()
	if due.IsZero() {
		return rd.NextWait(ctx)
	}
	wctx, cancel := context.WithDeadline(ctx, due)
	defer cancel()
	e, lost, err := rd.NextWait(wctx)
	if err != nil && ctx.Err() == nil {
		return nil, lost, nil // due: not the stream's end
	}
	return e, lost, err
}

// startSeq is where a request starts reading: the oldest event with first
// or since, the end with a bare follow, else far enough back to find the
// last number matching flows (all of the ring without a number).
func (s *Server) startSeq(q *flowsQuery, end uint64) uint64 {
	oldest := s.ring.oldest()
	switch {
	case q.first || !q.since.IsZero():
		return oldest
	case q.number == 0 && q.follow:
		return end
	case q.number == 0:
		return oldest
	}
	var found uint64
	for seq := end; seq > oldest; seq-- {
		e, ok, _ := s.ring.at(seq - 1)
		if !ok {
			return seq // overwritten while we looked: start after it
		}
		if e.flow == nil || !accepts(q.white, q.black, e.flow) {
			continue
		}
		if t := e.time(); !q.until.IsZero() && t.After(q.until) {
			continue
		}
		if found++; found == q.number {
			return seq - 1
		}
	}
	return oldest
}

func (s *Server) lostResponse(l *flowpb.LostEvent) *observerpb.GetFlowsResponse {
	if l.GetFirst() == nil && l.GetLast() == nil {
		now := timestamppb.Now()
		l.First, l.Last = now, now
	}
	return &observerpb.GetFlowsResponse{
		Time:          l.GetLast(),
		NodeName:      s.nodeName,
		ResponseTypes: &observerpb.GetFlowsResponse_LostEvents{LostEvents: l},
	}
}

// applyMask returns a new flow with only the masked fields of f.
func applyMask(f *flowpb.Flow, mask [][]protoreflect.Name) *flowpb.Flow {
	out := &flowpb.Flow{}
	for _, path := range mask {
		copyPath(out.ProtoReflect(), f.ProtoReflect(), path)
	}
	return out
}

func copyPath(dst, src protoreflect.Message, path []protoreflect.Name) {
	fd := src.Descriptor().Fields().ByName(path[0])
	if fd == nil || !src.Has(fd) {
		return
	}
	if len(path) == 1 || fd.Message() == nil || fd.IsList() || fd.IsMap() {
		dst.Set(fd, src.Get(fd))
		return
	}
	copyPath(dst.Mutable(fd).Message(), src.Get(fd).Message(), path[1:])
}

// String names the server for logs.
func (s *Server) String() string { return fmt.Sprintf("hubble observer of %s", s.nodeName) }
