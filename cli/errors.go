package cli

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/cellium/cellium/api/v1/client"
)

// noRoutePrefix starts the message of the agent's catch-all 404: the agent
// has no handler for the path at all (see cells/agentapi).
const noRoutePrefix = "no such API path"

// explain turns the error of a request made to do what ("get endpoint 7")
// into a message for a person. notFound, when not empty, replaces the
// agent's own message when the object asked for does not exist. Errors
// that are not the agent's refusals (unreachable agent, timeout) are
// wrapped unchanged so that app.call can recognise them.
func explain(err error, what, notFound string) error {
	var ae *client.APIError
	if !errors.As(err, &ae) {
		return fmt.Errorf("%s: %w", what, err)
	}
	msg := http.StatusText(ae.StatusCode)
	if ae.Payload != nil && ae.Payload.Message != "" {
		msg = ae.Payload.Message
	}
	switch {
	case ae.StatusCode == http.StatusNotFound && strings.HasPrefix(msg, noRoutePrefix):
		return fmt.Errorf("%s: the agent does not serve %s %s: is it older than this cellium CLI?", what, ae.Method, ae.Path)
	case ae.StatusCode == http.StatusNotFound && notFound != "":
		return errors.New(notFound)
	}
	return fmt.Errorf("%s: the agent answered %d: %s", what, ae.StatusCode, msg)
}
