package endpointmanager

import "errors"

var (
	// ErrInvalidRequest means the request lacks or has malformed fields.
	ErrInvalidRequest = errors.New("invalid endpoint request")
	// ErrNotFound means no endpoint matches.
	ErrNotFound = errors.New("endpoint not found")
	// ErrConflict means the request clashes with an existing endpoint or
	// with the pod's current state (another UID).
	ErrConflict = errors.New("endpoint conflict")
	// ErrIDsExhausted means all 4095 endpoint IDs are in use.
	ErrIDsExhausted = errors.New("no free endpoint ID: 4095 endpoints on this node")
	// ErrUnavailable means a dependency (identity allocation, the API
	// server) failed; retrying later may succeed.
	ErrUnavailable = errors.New("endpoint dependency unavailable")
)
