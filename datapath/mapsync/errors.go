package mapsync

import "errors"

// ErrPolicyTooLarge is returned (wrapped) by the policy map reconciler
// when an endpoint's policy has more entries than its map holds; the row's
// status says so. The map fails closed: it holds the policy's deny
// entries alone (FailClosed), so the endpoint drops all traffic until its
// policy fits. Fewer distinct identities or port ranges in the rules
// selecting the endpoint fix it.
var ErrPolicyTooLarge = errors.New("policy larger than the policy map")
