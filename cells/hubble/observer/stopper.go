package observer

import "context"

// stopper ends the streams a server serves when the server stops, so that
// a graceful stop does not wait for followers that never end by
// themselves.
type stopper struct {
	base   context.Context
	cancel context.CancelFunc
}

func newStopper() stopper {
	ctx, cancel := context.WithCancel(context.Background())
	return stopper{base: ctx, cancel: cancel}
}

// streamContext is parent, also cancelled when the server stops; call
// release when the stream ends.
func (s stopper) streamContext(parent context.Context) (ctx context.Context, release func()) {
	ctx, cancel := context.WithCancel(parent)
	unregister := context.AfterFunc(s.base, cancel)
	return ctx, func() { unregister(); cancel() }
}

// Shutdown ends every stream the server serves now or later.
func (s stopper) Shutdown() { s.cancel() }
