package tables

import (
	"context"

	"github.com/cilium/statedb"
)

// Health is what a deriver job reports to (hive.Health and
// reconciler.Health are).
type Health interface {
	OK(message string)
	Degraded(message string, err error)
}

// RunDeriver is the loop of a deriver job, until ctx ends: step consumes
// what changed in the input tables and writes the rows derived from it,
// adding to ws the channels that close when there is more to do (nil
// ones never close). Its outcome is the job's health: ok with the message
// step returns, or degraded with what and the error; a failed step is
// tried again once a channel closes.
func RunDeriver(ctx context.Context, h Health, what string, step func(ws *statedb.WatchSet) (string, error)) {
	ws := statedb.NewWatchSet()
	for {
		ws.Clear()
		msg, err := step(ws)
		if err != nil {
			h.Degraded(what, err)
		} else {
			h.OK(msg)
		}
		if _, err := ws.Wait(ctx, 0); err != nil {
			return
		}
	}
}
