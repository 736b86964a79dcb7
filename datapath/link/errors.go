package link

import "errors"

var (
	// ErrInvalidSpec is returned when a Spec or an argument is unusable
	// (empty container ID, interface name longer than 15 bytes, non-IPv4
	// address, MTU out of range, ...). Nothing was changed. A CNI plugin
	// maps it to "invalid network config" (code 7).
	ErrInvalidSpec = errors.New("invalid endpoint spec")

	// ErrNetnsNotFound is returned when a network namespace path does not
	// exist or is not a network namespace. SetupEndpoint and CheckEndpoint
	// return it for the pod's namespace (nothing was changed); every
	// function returns it for the Host's namespace. RemoveEndpoint treats
	// a missing pod namespace as already cleaned up.
	ErrNetnsNotFound = errors.New("network namespace not found")

	// ErrLinkNotFound is returned when the host-side link of an endpoint
	// does not exist (CheckEndpoint, EnsurePodRoute).
	ErrLinkNotFound = errors.New("link not found")

	// ErrHostLinkInUse is returned by SetupEndpoint when the host-side name
	// is taken by a link this package did not make for the same container
	// (a link that is not a veth, or a veth labelled with another
	// container's ID), or is the same container's veth with its peer in
	// another network namespace (a live attachment), and by RemoveEndpoint
	// when the name is not a veth.
	// That link is left untouched.
	ErrHostLinkInUse = errors.New("host link name in use")

	// ErrMismatch is returned (joined, once per problem) by CheckEndpoint
	// when a link, address, route or sysctl that SetupEndpoint makes is
	// missing or differs. Each problem's message says what and where.
	ErrMismatch = errors.New("endpoint does not match spec")
)
