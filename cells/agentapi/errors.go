package agentapi

import (
	"errors"
	"net/http"
)

// ErrorCode pairs a cell's sentinel error with the HTTP status the API
// answers when a handler's error matches it (errors.Is).
type ErrorCode struct {
	Err  error
	Code int
}

// ErrorCodes is a handler's mapping from sentinel errors to HTTP status
// codes: the one place where an API error gets its code. The cell keeps its
// sentinels free of HTTP; its handlers list the codes next to the routes.
// The first matching entry wins, so list the more specific errors first.
type ErrorCodes []ErrorCode

// Code returns the status code of err: the code of the first entry whose
// Err matches, else 500.
func (c ErrorCodes) Code(err error) int {
	for _, e := range c {
		if errors.Is(err, e.Err) {
			return e.Code
		}
	}
	return http.StatusInternalServerError
}

// Write writes err as an Error whose message is err's text and whose code
// is c.Code(err).
func (c ErrorCodes) Write(w http.ResponseWriter, err error) {
	WriteError(w, c.Code(err), "%s", err.Error())
}
