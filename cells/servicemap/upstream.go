package servicemap

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	observerpb "github.com/cilium/cilium/api/v1/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Backoff bounds of the reconnection: the first retry after minBackoff,
// doubling up to maxBackoff; a stream that delivered flows resets it.
const (
	minBackoff = time.Second
	maxBackoff = 30 * time.Second
	// statusTimeout bounds the ServerStatus call that opens each try.
	statusTimeout = 10 * time.Second
	// connectTimeout bounds one connection attempt (TCP and TLS, up to
	// the server's HTTP/2 preface): a relay that refuses our certificate
	// says so only there, and gRPC's default would wait 20 s to report it.
	connectTimeout = 5 * time.Second
)

// Reader follows the flows of an Observer (hubble-relay or an agent) into
// a Graph, reconnecting with backoff when the stream ends.
type Reader struct {
	address string
	conn    *grpc.ClientConn
	client  observerpb.ObserverClient
	since   time.Duration
	graph   *Graph
	log     *slog.Logger
	now     func() time.Time
}

// NewReader returns a reader of the Observer at address ("host:port",
// "dns:///host:port" or "unix:///path"), with creds (nil: plain text),
// that starts with the flows of the last since. It does not connect: Run
// does.
func NewReader(address string, creds credentials.TransportCredentials, since time.Duration, g *Graph, log *slog.Logger) (*Reader, error) {
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	conn, err := grpc.NewClient(address, grpc.WithTransportCredentials(creds),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.DefaultConfig, MinConnectTimeout: connectTimeout}))
	if err != nil {
		return nil, fmt.Errorf("hubble relay address %q: %w", address, err)
	}
	return &Reader{address: address, conn: conn, client: observerpb.NewObserverClient(conn),
		since: since, graph: g, log: log, now: time.Now}, nil
}

// Close closes the gRPC connection; call it after Run returned.
func (r *Reader) Close() error { return r.conn.Close() }

// Run reads flows until ctx is cancelled, reconnecting with backoff and
// recording the connection's state in the graph.
func (r *Reader) Run(ctx context.Context) {
	backoff := minBackoff
	var last time.Time // time of the last flow read: where a reconnection resumes
	r.setState(UpstreamConnecting, nil, nil, nil)
	for ctx.Err() == nil {
		delivered, err := r.follow(ctx, &last)
		if ctx.Err() != nil {
			return
		}
		if delivered {
			backoff = minBackoff
		}
		if err == nil {
			err = errors.New("the flow stream ended")
		}
		retry := r.now().Add(backoff)
		r.setState(UpstreamDisconnected, err, &retry, nil)
		r.log.Warn("Hubble flow stream lost, retrying", "address", r.address, "error", err, "retry-in", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, maxBackoff)
		r.setState(UpstreamConnecting, nil, nil, nil)
	}
}

// follow opens one stream and reads it until it ends; it reports whether
// any flow came.
func (r *Reader) follow(ctx context.Context, last *time.Time) (bool, error) {
	sctx, cancel := context.WithTimeout(ctx, statusTimeout)
	st, err := r.client.ServerStatus(sctx, &observerpb.ServerStatusRequest{})
	cancel()
	if err != nil {
		return false, fmt.Errorf("server status of %s: %w", r.address, err)
	}
	since := r.now().Add(-r.since)
	if !last.IsZero() {
		since = last.Add(time.Nanosecond) // resume without counting a flow twice
	}
	stream, err := r.client.GetFlows(ctx, &observerpb.GetFlowsRequest{Follow: true, Since: timestamppb.New(since)})
	if err != nil {
		return false, fmt.Errorf("get flows from %s: %w", r.address, err)
	}
	r.setState(UpstreamConnected, nil, nil, st)
	r.log.Info("Following Hubble flows", "address", r.address, "version", st.GetVersion(), "since", since)
	delivered := false
	for {
		resp, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = nil
			}
			return delivered, err
		}
		if f := resp.GetFlow(); f != nil {
			delivered = true
			if t := f.GetTime(); t != nil && t.IsValid() && t.AsTime().After(*last) {
				*last = t.AsTime()
			}
			r.graph.Add(f)
		}
		if l := resp.GetLostEvents(); l != nil {
			r.graph.AddLost(l.GetNumEventsLost())
		}
	}
}

func (r *Reader) setState(state string, err error, retry *time.Time, st *observerpb.ServerStatusResponse) {
	u := Upstream{Address: r.address, State: state, Since: r.now(), RetryAt: retry}
	if err != nil {
		u.Error = err.Error()
	}
	if st != nil {
		u.Version = st.GetVersion()
		u.ConnectedNodes = st.GetNumConnectedNodes().GetValue()
	}
	r.graph.SetUpstream(u)
}
