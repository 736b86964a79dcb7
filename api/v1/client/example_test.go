package client_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/cellium/cellium/api/v1/client"
)

// A caller tells the three kinds of failure apart: no agent, the agent's
// refusal, anything else.
func Example() {
	c := client.New("/run/cellium-example/no-agent.sock")
	defer c.Close()

	_, err := c.GetEndpoints(context.Background())
	switch {
	case errors.Is(err, client.ErrAgentUnreachable):
		fmt.Println("agent not running: retry later")
	case client.StatusCode(err) == http.StatusNotFound:
		fmt.Println("no such endpoint")
	case err != nil:
		fmt.Println("failed:", err)
	}
	// Output: agent not running: retry later
}
