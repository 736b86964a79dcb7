package servicemap

import (
	"bytes"
	"embed"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/cellium/cellium/cells/hive/httpserve"
)

//go:embed ui
var ui embed.FS

// Push pacing of /api/events: a snapshot at most every minPush while the
// graph changes, and at least every heartbeat (edge states change with
// time alone: red turns grey when DropWindow passes).
const (
	minPush   = 250 * time.Millisecond
	heartbeat = 5 * time.Second
)

// contentSecurityPolicy lets the page load only its own script and style
// and talk only to its own server.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"

// NewHandler serves the map of g read-only: the page (/, /app.js,
// /app.css), the graph as JSON (/api/graph) and its updates as
// Server-Sent Events (/api/events). Methods other than GET and HEAD get
// 405; there is nothing to write.
func NewHandler(g *Graph) http.Handler {
	mux := http.NewServeMux()
	static := func(name, contentType string) http.HandlerFunc {
		body, err := ui.ReadFile("ui/" + name)
		if err != nil {
			panic(fmt.Sprintf("servicemap: embedded %s is missing: %v", name, err)) // a build mistake
		}
		return func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", contentType)
			w.Header().Set("Cache-Control", "no-cache")
			_, _ = w.Write(body)
		}
	}
	mux.Handle("GET /{$}", static("index.html", "text/html; charset=utf-8"))
	mux.Handle("GET /app.js", static("app.js", "text/javascript; charset=utf-8"))
	mux.Handle("GET /app.css", static("app.css", "text/css; charset=utf-8"))
	mux.HandleFunc("GET /api/graph", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.SetEscapeHTML(false)
		_ = enc.Encode(g.Snapshot())
	})
	mux.HandleFunc("GET /api/events", func(w http.ResponseWriter, r *http.Request) {
		serveEvents(w, r, g)
	})
	return readOnly(mux)
}

// readOnly answers every method but GET and HEAD with 405 and sets the
// headers every answer carries.
func readOnly(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", contentSecurityPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			h.Set("Allow", "GET, HEAD")
			http.Error(w, fmt.Sprintf("method %s not allowed: the service map is read-only, use GET", r.Method), http.StatusMethodNotAllowed)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// serveEvents streams snapshots as "graph" events until the client goes
// or the server stops.
func serveEvents(w http.ResponseWriter, r *http.Request, g *Graph) {
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	ctx := r.Context()
	stopping := httpserve.Stopping(ctx)
	tick := time.NewTicker(heartbeat)
	defer tick.Stop()
	for {
		changed := g.Changed()
		var body bytes.Buffer
		enc := json.NewEncoder(&body)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(g.Snapshot()); err != nil {
			return
		}
		// Encode ends the JSON with a newline: one data line, then the
		// blank line that ends the event.
		if _, err := fmt.Fprintf(w, "event: graph\ndata: %s\n", body.Bytes()); err != nil {
			return
		}
		if err := rc.Flush(); err != nil {
			return
		}
		sent := time.Now()
		select {
		case <-ctx.Done():
			return
		case <-stopping:
			return
		case <-changed:
		case <-tick.C:
		}
		// Pace: no more than one snapshot per minPush; a change after a
		// quiet stretch goes out at once.
		select {
		case <-ctx.Done():
			return
		case <-stopping:
			return
		case <-time.After(minPush - time.Since(sent)):
		}
	}
}
