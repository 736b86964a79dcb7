// Package client is the Go client of the agent's API: HTTP/JSON on the
// agent's unix socket, below /v1. The CNI plugin and the `cellium` CLI use
// it; it depends only on the JSON types in api/v1/models.
//
// Every method takes a context. When the context has no deadline the
// client applies DefaultTimeout, so a call never hangs on a stuck agent.
// Errors are of three kinds, told apart with errors.Is and errors.As:
//
//   - ErrAgentUnreachable (wrapped): the socket could not be dialed, the
//     agent is not running or not ready to accept connections;
//   - *APIError: the agent answered with a status outside 2xx and the
//     JSON body {code, message} of models.Error, which APIError unwraps to;
//   - anything else: the connection broke during the call, the context
//     ended, or a reply could not be decoded.
package client
