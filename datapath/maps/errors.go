package maps

import "errors"

// ErrInvalidKey is returned when a key read from a map, or given to
// encode, cannot be represented: an address of the wrong family, a policy
// prefix length outside 40..64.
var ErrInvalidKey = errors.New("invalid map key")

// ErrShortEvent is returned by DecodeEvent for a record shorter than an
// event.
var ErrShortEvent = errors.New("event record too short")

// ErrEventVersion is returned by DecodeEvent for a record of a layout
// version this build does not know.
var ErrEventVersion = errors.New("unknown event record version")
