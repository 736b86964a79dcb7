package k8s

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"k8s.io/client-go/rest"
)

// applyTimeouts bounds how long a request may wait on an API server that
// is down or unreachable: connecting takes at most connTimeout (with TCP
// keep-alives every keepAlive, so that a dead peer is noticed), and every
// request but a watch at most reqTimeout from start to the end of its
// body. Watches are long-lived by design; their reflectors re-establish
// them.
func applyTimeouts(rc *rest.Config, connTimeout, keepAlive, reqTimeout time.Duration) {
	if connTimeout > 0 && rc.Dial == nil {
		d := &net.Dialer{Timeout: connTimeout, KeepAlive: keepAlive}
		rc.Dial = d.DialContext
	}
	if reqTimeout <= 0 {
		return
	}
	prev := rc.WrapTransport
	rc.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		if prev != nil {
			rt = prev(rt)
		}
		return &timeoutRoundTripper{next: rt, timeout: reqTimeout}
	}
}

// timeoutRoundTripper gives each non-watch request a deadline.
type timeoutRoundTripper struct {
	next    http.RoundTripper
	timeout time.Duration
}

func (t *timeoutRoundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	if isWatch(req) {
		return t.next.RoundTrip(req)
	}
	ctx, cancel := context.WithTimeout(req.Context(), t.timeout)
	resp, err := t.next.RoundTrip(req.WithContext(ctx))
	if err != nil {
		cancel()
		return nil, err
	}
	resp.Body = &cancelOnClose{ReadCloser: resp.Body, cancel: cancel}
	return resp, nil
}

// WrappedRoundTripper lets client-go's helpers (closing idle connections)
// reach the transport underneath.
func (t *timeoutRoundTripper) WrappedRoundTripper() http.RoundTripper { return t.next }

func isWatch(req *http.Request) bool {
	q := req.URL.Query()
	return q.Get("watch") == "true" || q.Get("watch") == "1" || strings.Contains(req.URL.Path, "/watch/")
}

// cancelOnClose releases the request's deadline when its body is closed.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (c *cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel()
	return err
}
