package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"github.com/cellium/cellium/api/v1/models"
)

// MonitorStream is an open GET /v1/monitor: the agent's datapath events as
// they happen. Close it when done.
type MonitorStream struct {
	body io.ReadCloser
	dec  *json.Decoder
}

// Monitor opens the stream of datapath events of the given types (all
// when none: drop, trace, policy-verdict) and, when endpoints are given,
// only of those endpoints (GET /v1/monitor?type=...&endpoint=...). It returns
// once the agent has answered; the stream then lasts until ctx ends, the
// stream is closed or the agent stops. Unlike the other methods it applies
// no DefaultTimeout: bound the wait for the answer with ctx if needed, and
// keep ctx alive as long as the stream is read.
//
// Errors: as Do's (ErrAgentUnreachable, *APIError for an unknown type,
// the context's error).
func (c *Client) Monitor(ctx context.Context, types []string, endpoints []uint16) (*MonitorStream, error) {
	q := url.Values{}
	for _, t := range types {
		q.Add("type", t)
	}
	for _, ep := range endpoints {
		q.Add("endpoint", strconv.Itoa(int(ep)))
	}
	path := "/v1/monitor"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://cellium-agent"+path, nil)
	if err != nil {
		return nil, fmt.Errorf("agent API GET %s: %w", path, err)
	}
	req.Header.Set("Accept", "application/x-ndjson")
	resp, err := c.http.Do(req)
	if err != nil {
		var de *dialError
		if errors.As(err, &de) {
			return nil, fmt.Errorf("%w: connect to %s: %w (is cellium-agent running?)", ErrAgentUnreachable, c.socketPath, de.err)
		}
		return nil, fmt.Errorf("agent API GET %s: %w", path, unwrapURLError(err))
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		defer resp.Body.Close()
		return nil, decodeAPIError(http.MethodGet, req.URL.Path, resp)
	}
	return &MonitorStream{body: resp.Body, dec: json.NewDecoder(resp.Body)}, nil
}

// Next returns the next event, waiting for it.
//
// Errors: io.EOF when the agent ended the stream (it is stopping); the
// context's error (possibly wrapped) once the stream's context ended;
// a decoding error when a line is not an event.
func (s *MonitorStream) Next() (models.MonitorEvent, error) {
	var ev models.MonitorEvent
	if err := s.dec.Decode(&ev); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return ev, io.EOF
		}
		return ev, fmt.Errorf("read monitor event: %w", err)
	}
	return ev, nil
}

// Close ends the stream; the agent sees the client go.
func (s *MonitorStream) Close() error { return s.body.Close() }
