package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
)

// TableChange is one line of GET /v1/statedb/{table}/changes: a row of
// the table as inserted (or, with Deleted, as it was when deleted) at
// Revision. A keep-alive line has no Object and Revision 0.
type TableChange struct {
	// Object is the row as the table dumps it (its JSON form).
	Object json.RawMessage `json:"obj"`
	// Revision is the row's revision in the table.
	Revision uint64 `json:"rev"`
	// Deleted is set when the row was deleted.
	Deleted bool `json:"deleted,omitempty"`
}

// TableChanges is an open GET /v1/statedb/{table}/changes. Close it when
// done.
type TableChanges struct {
	body io.ReadCloser
	dec  *json.Decoder
}

// WatchStatedbTable opens the stream of one statedb table's changes: every
// row first, then every insert and delete as it commits (GET
// /v1/statedb/{name}/changes). Like Monitor it applies no DefaultTimeout:
// the stream lasts until ctx ends, it is closed or the agent stops.
//
// Errors: as Do's (ErrAgentUnreachable, *APIError 404 for an unknown
// table, the context's error).
func (c *Client) WatchStatedbTable(ctx context.Context, name string) (*TableChanges, error) {
	path := "/v1/statedb/" + url.PathEscape(name) + "/changes"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://cellium-agent"+path, nil)
	if err != nil {
		return nil, fmt.Errorf("agent API GET %s: %w", path, err)
	}
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
	return &TableChanges{body: resp.Body, dec: json.NewDecoder(resp.Body)}, nil
}

// Next returns the next change, waiting for it; keep-alive lines are
// skipped.
//
// Errors: io.EOF when the agent ended the stream; the context's error
// (possibly wrapped) once the stream's context ended; a decoding error.
func (s *TableChanges) Next() (TableChange, error) {
	for {
		var ch TableChange
		if err := s.dec.Decode(&ch); err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				return ch, io.EOF
			}
			return ch, fmt.Errorf("read table change: %w", err)
		}
		if ch.Revision == 0 { // a keep-alive: rows have revisions from 1
			continue
		}
		return ch, nil
	}
}

// Close ends the stream.
func (s *TableChanges) Close() error { return s.body.Close() }
