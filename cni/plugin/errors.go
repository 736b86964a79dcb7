package plugin

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/cellium/cellium/api/v1/client"
	"github.com/cellium/cellium/datapath/link"
)

// Error codes of the plugin's own (the CNI specification leaves 100 and
// above to plugins). The well-known codes it uses are the types.Err*
// constants: 1, 4, 6, 7, 8, 11, 50 and 999.
const (
	// ErrCodeEndpointNotFound is CHECK's answer when the agent has no
	// endpoint for the container.
	ErrCodeEndpointNotFound uint = 100

	// ErrCodeEndpointMismatch is CHECK's answer when the interfaces,
	// addresses or routes differ from what ADD made, or the agent's
	// endpoint is not usable (invalid, being deleted, another address).
	ErrCodeEndpointMismatch uint = 101

	// ErrCodeInterfaceExists is ADD's answer when the pod's network
	// namespace already has an interface named CNI_IFNAME.
	ErrCodeInterfaceExists uint = 102
)

// newError returns a CNI error with the given code. msg is a short summary,
// details the cause and what to do.
func newError(code uint, msg string, details string) *types.Error {
	return types.NewError(code, msg, details)
}

// agentError turns a failed call to the agent into a CNI error. op says
// what the plugin asked ("allocate IP"). The agent being unreachable,
// overloaded (429), not ready (503), slow (deadline) or dropping the
// connection is transient: ErrTryAgainLater. An agent that refused the
// request for any other reason is ErrInternal with the agent's message.
func agentError(op string, err error) *types.Error {
	if err == nil {
		return nil
	}
	switch {
	case errors.Is(err, client.ErrAgentUnreachable):
		return newError(types.ErrTryAgainLater, "cellium agent unreachable",
			fmt.Sprintf("%s: %v; the plugin retries once the runtime calls it again", op, err))
	case errors.Is(err, context.DeadlineExceeded):
		return newError(types.ErrTryAgainLater, "cellium agent did not answer in time",
			fmt.Sprintf("%s: %v", op, err))
	}
	if code := client.StatusCode(err); code != 0 {
		if code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable {
			return newError(types.ErrTryAgainLater, "cellium agent busy or not ready",
				fmt.Sprintf("%s: %v", op, err))
		}
		return newError(types.ErrInternal, op+" failed", err.Error())
	}
	// The connection broke during the call: the agent restarted or died.
	return newError(types.ErrTryAgainLater, "connection to the cellium agent failed",
		fmt.Sprintf("%s: %v", op, err))
}

// isTransient reports whether a failed call to the agent is worth
// retrying later (the error agentError maps to ErrTryAgainLater).
func isTransient(err error) bool {
	return err != nil && agentError("", err).Code == types.ErrTryAgainLater
}

// linkError turns a failure of datapath/link into a CNI error.
func linkError(op string, err error) *types.Error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, link.ErrNetnsNotFound):
		return newError(types.ErrInvalidNetNS, "network namespace not found", fmt.Sprintf("%s: %v", op, err))
	case errors.Is(err, link.ErrInvalidSpec):
		return newError(types.ErrInvalidNetworkConfig, op+": invalid parameters", err.Error())
	case errors.Is(err, link.ErrLinkNotFound), errors.Is(err, link.ErrMismatch):
		return newError(ErrCodeEndpointMismatch, "pod interface differs from what ADD made", fmt.Sprintf("%s: %v", op, err))
	}
	return newError(types.ErrInternal, op+" failed", err.Error())
}

// withRollback adds the errors of a rollback to a CNI error's details, so
// that what could not be undone is on record.
func withRollback(e *types.Error, rollback error) *types.Error {
	if rollback == nil {
		return e
	}
	return newError(e.Code, e.Msg, fmt.Sprintf("%s; rollback incomplete: %v", e.Details, rollback))
}
