package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/cellium/cellium/api/v1/models"
)

const (
	// DefaultSocketPath is the agent API socket (the agent's --socket-path
	// default).
	DefaultSocketPath = "/var/run/cellium/cellium.sock"

	// DefaultTimeout bounds a call whose context has no deadline. It is
	// long because PUT /v1/endpoint with sync-build-endpoint waits until
	// the endpoint is ready.
	DefaultTimeout = 2 * time.Minute

	// dialTimeout bounds connecting to the socket: a unix socket connects
	// at once or not at all, unless the agent's accept backlog is full.
	dialTimeout = 5 * time.Second

	// maxErrorBody bounds how much of a failed reply is read.
	maxErrorBody = 64 << 10
)

// Client talks to one agent over its unix socket. It is safe for
// concurrent use and keeps a few idle connections; Close releases them.
type Client struct {
	socketPath string
	transport  *http.Transport
	http       *http.Client
}

// New returns a client of the agent listening on socketPath
// (DefaultSocketPath when empty). It does not connect: the first call
// does.
func New(socketPath string) *Client {
	if socketPath == "" {
		socketPath = DefaultSocketPath
	}
	dialer := &net.Dialer{Timeout: dialTimeout}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			conn, err := dialer.DialContext(ctx, "unix", socketPath)
			if err != nil {
				return nil, &dialError{err: err}
			}
			return conn, nil
		},
		MaxIdleConns:        4,
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
	}
	return &Client{
		socketPath: socketPath,
		transport:  tr,
		http:       &http.Client{Transport: tr},
	}
}

// dialError marks a failure to connect, as opposed to a failure during an
// exchange on an open connection.
type dialError struct{ err error }

func (e *dialError) Error() string { return e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

// SocketPath returns the socket the client connects to.
func (c *Client) SocketPath() string { return c.socketPath }

// Close closes idle connections. The client stays usable.
func (c *Client) Close() { c.transport.CloseIdleConnections() }

// Do sends a request to the agent and decodes a 2xx reply's JSON body into
// out (unless out is nil). path is below the host, with the /v1 prefix and
// an optional query ("/v1/statedb?format=yaml"); body, when not nil, is
// sent as JSON. The typed methods are built on it; it is exported for
// paths they do not cover.
//
// Errors: ErrAgentUnreachable (wrapped) when the socket cannot be dialed;
// *APIError for a reply outside 2xx; the context's error; transport and
// decoding errors.
func (c *Client) Do(ctx context.Context, method, path string, body, out any) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultTimeout)
		defer cancel()
	}
	var rd io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("agent API %s %s: encode request: %w", method, path, err)
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://cellium-agent"+path, rd)
	if err != nil {
		return fmt.Errorf("agent API %s %s: %w", method, path, err)
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		var de *dialError
		if errors.As(err, &de) {
			return fmt.Errorf("%w: connect to %s: %w (is cellium-agent running?)", ErrAgentUnreachable, c.socketPath, de.err)
		}
		return fmt.Errorf("agent API %s %s: %w", method, path, unwrapURLError(err))
	}
	defer resp.Body.Close()

	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return decodeAPIError(method, req.URL.Path, resp)
	}
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		if errors.Is(err, io.EOF) {
			err = errors.New("empty reply")
		}
		return fmt.Errorf("agent API %s %s: decode reply: %w", method, path, err)
	}
	return nil
}

// unwrapURLError drops net/http's *url.Error wrapper, whose message
// repeats the made-up URL; the cause stays reachable with errors.Is.
func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

func decodeAPIError(method, path string, resp *http.Response) error {
	data, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	e := &APIError{Method: method, Path: path, StatusCode: resp.StatusCode}
	var m models.Error
	if err := json.Unmarshal(data, &m); err == nil && (m.Code != 0 || m.Message != "") {
		e.Payload = &m
	} else {
		e.Payload = &models.Error{Code: resp.StatusCode, Message: strings.TrimSpace(string(data))}
	}
	return e
}

// GetHealthz returns the agent's health (GET /v1/healthz).
func (c *Client) GetHealthz(ctx context.Context) (*models.Health, error) {
	var h models.Health
	if err := c.Do(ctx, http.MethodGet, "/v1/healthz", nil, &h); err != nil {
		return nil, err
	}
	return &h, nil
}

// GetConfig returns what clients need to know of the agent's
// configuration (GET /v1/config).
func (c *Client) GetConfig(ctx context.Context) (*models.DaemonConfig, error) {
	var cfg models.DaemonConfig
	if err := c.Do(ctx, http.MethodGet, "/v1/config", nil, &cfg); err != nil {
		return nil, err
	}
	return &cfg, nil
}

// AllocateIP allocates a pod address for owner ("namespace/pod") and the
// pod sandbox containerID (empty when there is none)
// (POST /v1/ipam?owner=...&container-id=...). The reply's IPv4 is never
// nil; its MTU is the pod MTU, 0 from an agent that does not send it.
func (c *Client) AllocateIP(ctx context.Context, owner, containerID string) (*models.IPAMResponse, error) {
	var resp models.IPAMResponse
	q := url.Values{"owner": {owner}}
	if containerID != "" {
		q.Set("container-id", containerID)
	}
	path := "/v1/ipam?" + q.Encode()
	if err := c.Do(ctx, http.MethodPost, path, nil, &resp); err != nil {
		return nil, err
	}
	if resp.IPv4 == nil || resp.IPv4.IP == "" {
		return nil, fmt.Errorf("agent API POST /v1/ipam: reply has no IPv4 address")
	}
	return &resp, nil
}

// ReleaseIP releases an address (DELETE /v1/ipam/{ip}). An address that is
// not allocated is not an error.
func (c *Client) ReleaseIP(ctx context.Context, ip string) error {
	err := c.Do(ctx, http.MethodDelete, "/v1/ipam/"+url.PathEscape(ip), nil, nil)
	if IsNotFound(err) {
		return nil
	}
	return err
}

// ReleaseContainerIP releases ip only if the container containerID holds
// it (DELETE /v1/ipam/{ip}?container-id=...). released is false, with no
// error, when the address is not allocated; an address held by someone
// else is an *APIError with status 409.
func (c *Client) ReleaseContainerIP(ctx context.Context, ip, containerID string) (released bool, err error) {
	path := "/v1/ipam/" + url.PathEscape(ip) + "?" + url.Values{"container-id": {containerID}}.Encode()
	err = c.Do(ctx, http.MethodDelete, path, nil, nil)
	if IsNotFound(err) {
		return false, nil
	}
	return err == nil, err
}

// PutEndpoint asks the agent to create the endpoint described by req
// (PUT /v1/endpoint) and returns it. With req.SyncBuildEndpoint the agent
// answers once the endpoint is ready.
func (c *Client) PutEndpoint(ctx context.Context, req *models.EndpointChangeRequest) (*models.Endpoint, error) {
	var ep models.Endpoint
	if err := c.Do(ctx, http.MethodPut, "/v1/endpoint", req, &ep); err != nil {
		return nil, err
	}
	return &ep, nil
}

// DeleteEndpointByContainerID deletes the endpoint of a container
// (DELETE /v1/endpoint?container-id=...) and releases every address
// allocated to the container, with or without an endpoint. found is
// false, with no error, when the agent had neither.
func (c *Client) DeleteEndpointByContainerID(ctx context.Context, containerID string) (found bool, err error) {
	return c.deleteEndpoint(ctx, url.Values{"container-id": {containerID}})
}

// DeleteAttempt undoes one ADD of a container: it deletes the container's
// endpoint only if it has address ip, and releases ip only if the
// container holds it (DELETE /v1/endpoint?container-id=...&ip=...). An
// older endpoint of the same container with another address is left
// alone. found is false, with no error, when there was nothing to undo.
func (c *Client) DeleteAttempt(ctx context.Context, containerID, ip string) (found bool, err error) {
	return c.deleteEndpoint(ctx, url.Values{"container-id": {containerID}, "ip": {ip}})
}

func (c *Client) deleteEndpoint(ctx context.Context, q url.Values) (found bool, err error) {
	path := "/v1/endpoint?" + q.Encode()
	err = c.Do(ctx, http.MethodDelete, path, nil, nil)
	if IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return true, nil
}

// GetEndpoints lists the agent's endpoints (GET /v1/endpoint).
func (c *Client) GetEndpoints(ctx context.Context) ([]models.Endpoint, error) {
	var eps []models.Endpoint
	if err := c.Do(ctx, http.MethodGet, "/v1/endpoint", nil, &eps); err != nil {
		return nil, err
	}
	return eps, nil
}

// GetEndpoint returns one endpoint (GET /v1/endpoint/{id}); id is the
// endpoint ID or any other form of it the agent accepts.
func (c *Client) GetEndpoint(ctx context.Context, id string) (*models.Endpoint, error) {
	var ep models.Endpoint
	if err := c.Do(ctx, http.MethodGet, "/v1/endpoint/"+url.PathEscape(id), nil, &ep); err != nil {
		return nil, err
	}
	return &ep, nil
}

// PatchEndpointLabels adds and deletes labels of an endpoint
// (PATCH /v1/endpoint/{id}/labels). The reply's body is ignored.
func (c *Client) PatchEndpointLabels(ctx context.Context, id string, patch *models.LabelsPatch) error {
	return c.Do(ctx, http.MethodPatch, "/v1/endpoint/"+url.PathEscape(id)+"/labels", patch, nil)
}

// RegenerateEndpoint asks the agent to regenerate an endpoint
// (POST /v1/endpoint/{id}/regenerate). The reply's body is ignored.
func (c *Client) RegenerateEndpoint(ctx context.Context, id string) error {
	return c.Do(ctx, http.MethodPost, "/v1/endpoint/"+url.PathEscape(id)+"/regenerate", nil, nil)
}

// GetIdentities lists the security identities the agent knows
// (GET /v1/identity).
func (c *Client) GetIdentities(ctx context.Context) ([]models.Identity, error) {
	var ids []models.Identity
	if err := c.Do(ctx, http.MethodGet, "/v1/identity", nil, &ids); err != nil {
		return nil, err
	}
	return ids, nil
}

// GetIdentity returns one identity (GET /v1/identity/{id}).
func (c *Client) GetIdentity(ctx context.Context, id string) (*models.Identity, error) {
	var ident models.Identity
	if err := c.Do(ctx, http.MethodGet, "/v1/identity/"+url.PathEscape(id), nil, &ident); err != nil {
		return nil, err
	}
	return &ident, nil
}

// GetNodes lists the cluster's nodes as the agent sees them
// (GET /v1/node).
func (c *Client) GetNodes(ctx context.Context) ([]models.Node, error) {
	var nodes []models.Node
	if err := c.Do(ctx, http.MethodGet, "/v1/node", nil, &nodes); err != nil {
		return nil, err
	}
	return nodes, nil
}

// GetStatedbTable returns the objects of one of the agent's statedb
// tables as a JSON array (GET /v1/statedb/{name}).
func (c *Client) GetStatedbTable(ctx context.Context, name string) (json.RawMessage, error) {
	var objs json.RawMessage
	if err := c.Do(ctx, http.MethodGet, "/v1/statedb/"+url.PathEscape(name), nil, &objs); err != nil {
		return nil, err
	}
	return objs, nil
}
