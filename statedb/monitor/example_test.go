package monitor_test

import (
	"fmt"

	"github.com/cellium/cellium/statedb/monitor"
)

// A reader subscribes to the drops of one endpoint; the publisher (the
// datapath) never waits for it.
func Example() {
	hub := monitor.NewHub()
	defer hub.Close()

	sub := hub.Subscribe(monitor.Filter{Types: []monitor.Type{monitor.TypeDrop}, EndpointIDs: []uint16{1234}}, 16)
	defer sub.Close()

	hub.Publish(monitor.Event{Type: monitor.TypeDrop, EndpointID: 99, Reason: 133, ReasonName: "Policy denied"})
	hub.Publish(monitor.Event{Type: monitor.TypePolicyVerdict, EndpointID: 1234, Verdict: monitor.VerdictDeny})
	hub.Publish(monitor.Event{Type: monitor.TypeDrop, EndpointID: 1234, Reason: 133, ReasonName: "Policy denied"})

	ev := <-sub.Events()
	fmt.Printf("%s of endpoint %d: %s (lost %d)\n", ev.Type, ev.EndpointID, ev.ReasonName, sub.Lost())
	// Output: drop of endpoint 1234: Policy denied (lost 0)
}
