package client

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/cellium/cellium/api/v1/models"
)

// ErrAgentUnreachable is returned (wrapped, with the socket path and the
// dial error) when the agent's socket cannot be dialed: the socket file is
// missing, nobody listens on it, or its permissions refuse the caller.
// The request was not sent. A CNI plugin reports it as "try again later".
var ErrAgentUnreachable = errors.New("cellium agent unreachable")

// APIError is the agent's answer to a request it refused: any HTTP status
// outside 2xx. It unwraps to the models.Error of the reply's body, so
// errors.As(err, &modelsErr) works too.
type APIError struct {
	// Method and Path are the request's, e.g. "PUT" and "/v1/endpoint".
	Method string
	Path   string
	// StatusCode is the HTTP status of the reply.
	StatusCode int
	// Payload is the reply's body. When the body was not the API's JSON
	// error, Payload.Code is StatusCode and Payload.Message the body's text.
	Payload *models.Error
}

func (e *APIError) Error() string {
	msg := ""
	if e.Payload != nil {
		msg = e.Payload.Message
	}
	if msg == "" {
		msg = http.StatusText(e.StatusCode)
	}
	return fmt.Sprintf("agent API %s %s: %d: %s", e.Method, e.Path, e.StatusCode, msg)
}

// Unwrap returns the reply's models.Error.
func (e *APIError) Unwrap() error {
	if e.Payload == nil {
		return nil
	}
	return e.Payload
}

// StatusCode returns the HTTP status of the agent's reply when err is, or
// wraps, an *APIError, and 0 otherwise.
func StatusCode(err error) int {
	var ae *APIError
	if errors.As(err, &ae) {
		return ae.StatusCode
	}
	return 0
}

// IsNotFound reports whether err is the agent's 404 reply.
func IsNotFound(err error) bool {
	return StatusCode(err) == http.StatusNotFound
}
