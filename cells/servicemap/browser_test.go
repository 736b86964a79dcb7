package servicemap_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// chromiumNames are the browser binaries the browser test looks for, in
// order: Debian's (make deps installs it), other distributions', Google's.
var chromiumNames = []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"}

// findChromium returns the browser binary or skips the test, failing it
// instead under CELLIUM_REQUIRE_PRIVILEGED=1 (CI installs the browser)
// unless -short.
func findChromium(t *testing.T) string {
	t.Helper()
	for _, name := range chromiumNames {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	msg := fmt.Sprintf("no headless browser: none of %s is on PATH (make deps installs Debian's chromium)", strings.Join(chromiumNames, ", "))
	if os.Getenv("CELLIUM_REQUIRE_PRIVILEGED") == "1" && !testing.Short() {
		t.Fatal(msg + "; CELLIUM_REQUIRE_PRIVILEGED=1 makes this a failure (make test-unit's -short does not)")
	}
	t.Skip(msg)
	return ""
}

// browser starts a headless chromium with a throw-away profile and returns
// its chromedp context; the browser is closed and its process waited for
// when the test ends.
func browser(t *testing.T) context.Context {
	t.Helper()
	path := findChromium(t)
	var out bytes.Buffer
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
		chromedp.CombinedOutput(&out),
	)
	if os.Geteuid() == 0 {
		// Chromium refuses to run as root with its sandbox.
		opts = append(opts, chromedp.NoSandbox)
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(allocCtx, chromedp.WithLogf(t.Logf))
	t.Cleanup(func() {
		if err := chromedp.Cancel(ctx); err != nil {
			t.Logf("close the browser: %v", err)
		}
		cancel()
		cancelAlloc()
		if t.Failed() && out.Len() > 0 {
			t.Logf("browser output:\n%s", out.String())
		}
	})
	// The first Run starts the browser; it must not carry a timeout.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start %s: %v", path, err)
	}
	return ctx
}

// edgeSelector is the CSS selector of an edge of the map by its id.
func edgeSelector(id string) string { return fmt.Sprintf(`path.edge[data-edge-id=%q]`, id) }

// waitEdge waits until the page draws the edge with the state, and
// returns how long it took.
func waitEdge(t *testing.T, ctx context.Context, id, state string) time.Duration {
	t.Helper()
	start := time.Now()
	cond := fmt.Sprintf(`(() => { const e = document.querySelector(%q); return !!e && e.dataset.state === %q; })()`, edgeSelector(id), state)
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](cond, chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(10*time.Second))); err != nil {
		page, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById("map").outerHTML + "\n" + document.querySelector("header").innerText`))
		t.Fatalf("edge %q in state %q not drawn within 10 s: %v\npage: %s", id, state, err, page)
	}
	return time.Since(start)
}

// edgeInfo is what the page shows of an edge.
type edgeInfo struct {
	Stroke string  `json:"stroke"`
	Title  string  `json:"title"`
	X      float64 `json:"x"`
	Y      float64 `json:"y"`
}

func readEdge(t *testing.T, ctx context.Context, id string) edgeInfo {
	t.Helper()
	js := fmt.Sprintf(`(() => {
		const e = document.querySelector(%q);
		const svg = document.getElementById("map").getBoundingClientRect();
		const p = e.getPointAtLength(e.getTotalLength() / 2);
		return { stroke: getComputedStyle(e).stroke, title: e.querySelector("title").textContent,
			x: svg.left + p.x, y: svg.top + p.y };
	})()`, edgeSelector(id))
	info, err := chromedp.Run(ctx, chromedp.Evaluate[edgeInfo](js))
	if err != nil {
		t.Fatalf("read edge %q: %v", id, err)
	}
	return info
}

// hover moves the mouse to (x, y) and returns the tooltip's text once it
// shows.
func hover(t *testing.T, ctx context.Context, x, y float64) string {
	t.Helper()
	if err := chromedp.Do(ctx,
		chromedp.MouseEvent(chromedp.MouseMoved, x-3, y-3),
		chromedp.MouseEvent(chromedp.MouseMoved, x, y),
	); err != nil {
		t.Fatalf("move the mouse: %v", err)
	}
	tip, err := chromedp.Run(ctx, chromedp.Poll[string](`(() => { const t = document.getElementById("tooltip"); return t.hidden ? "" : t.textContent; })()`,
		chromedp.WithPollingInterval(20*time.Millisecond), chromedp.WithPollingTimeout(5*time.Second)))
	if err != nil {
		t.Fatalf("hover at (%.0f, %.0f): no tooltip: %v", x, y, err)
	}
	return tip
}

// The browser test: the agent's real Hubble server, the operator's service
// map cell reading it, Debian's chromium showing the page. A denied flow
// becomes a red edge within seconds whose hover names the denying policy;
// an allowed flow a green one naming the allowing policy.
func TestBrowserShowsDeniedFlowAsRedEdge(t *testing.T) {
	ctx := browser(t)
	socket := socketPath(t)
	a := startAgent(t, socket)
	base := startMap(t, "unix://"+socket)

	if err := chromedp.Do(ctx, chromedp.Navigate(base+"/"), chromedp.WaitVisible("#map")); err != nil {
		t.Fatalf("open %s: %v", base, err)
	}
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](`document.getElementById("upstream").dataset.state === "connected"`,
		chromedp.WithPollingTimeout(10*time.Second))); err != nil {
		t.Fatalf("the page never showed the upstream connected: %v", err)
	}

	a.send(deniedFlow())
	took := waitEdge(t, ctx, deniedEdge, "dropped")
	t.Logf("the denied flow was a red edge on the page %s after it reached the agent's ring", took.Round(time.Millisecond))
	red := readEdge(t, ctx, deniedEdge)
	if red.Stroke != "rgb(214, 39, 40)" {
		t.Errorf("denied edge stroke %q, want red rgb(214, 39, 40)", red.Stroke)
	}
	for _, want := range []string{"denied by: CiliumNetworkPolicy demo/db-deny-redis", "port: 6379/TCP", "1 dropped", "last verdict: DROPPED (POLICY_DENIED)"} {
		if !strings.Contains(red.Title, want) {
			t.Errorf("denied edge's <title> lacks %q:\n%s", want, red.Title)
		}
	}
	if tip := hover(t, ctx, red.X, red.Y); !strings.Contains(tip, "denied by: CiliumNetworkPolicy demo/db-deny-redis") {
		t.Errorf("hovering the red edge shows %q, want the denying policy", tip)
	}

	a.send(allowedFlow())
	waitEdge(t, ctx, allowedEdge, "forwarded")
	green := readEdge(t, ctx, allowedEdge)
	if green.Stroke != "rgb(44, 160, 44)" {
		t.Errorf("allowed edge stroke %q, want green rgb(44, 160, 44)", green.Stroke)
	}
	if !strings.Contains(green.Title, "allowed by: CiliumNetworkPolicy demo/db-allow-web") || strings.Contains(green.Title, "denied by") {
		t.Errorf("allowed edge's <title>:\n%s", green.Title)
	}
	if tip := hover(t, ctx, green.X, green.Y); !strings.Contains(tip, "allowed by: CiliumNetworkPolicy demo/db-allow-web") {
		t.Errorf("hovering the green edge shows %q", tip)
	}
	// The denied edge stays red beside it.
	if s := readEdge(t, ctx, deniedEdge).Stroke; s != red.Stroke {
		t.Errorf("denied edge turned %q after an allowed flow on another port", s)
	}
	// The nodes are the two workloads, grouped under their namespace.
	names, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](
		`[...document.querySelectorAll("g.node")].map(n => n.dataset.nodeId).concat([...document.querySelectorAll("rect.ns-box")].map(r => "ns:" + r.dataset.namespace))`))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(names, ","); got != "demo/db,demo/web,ns:demo" {
		t.Errorf("nodes and namespaces on the page: %s, want demo/db,demo/web,ns:demo", got)
	}
}

// When the agent goes away the page says so, and shows the edges again
// once it is back.
func TestBrowserShowsUpstreamDown(t *testing.T) {
	ctx := browser(t)
	socket := socketPath(t)
	base := startMap(t, "unix://"+socket)
	if err := chromedp.Do(ctx, chromedp.Navigate(base+"/"), chromedp.WaitVisible("#map")); err != nil {
		t.Fatalf("open %s: %v", base, err)
	}
	text, err := chromedp.Run(ctx, chromedp.Poll[string](
		`(() => { const u = document.getElementById("upstream"); return u.dataset.state === "disconnected" ? u.textContent : ""; })()`,
		chromedp.WithPollingTimeout(10*time.Second)))
	if err != nil {
		t.Fatalf("the page never showed the upstream down: %v", err)
	}
	if !strings.Contains(text, socket) || !strings.Contains(text, "retrying at") {
		t.Errorf("upstream status %q: want the address and when it retries", text)
	}
	a := startAgent(t, socket)
	a.send(deniedFlow())
	waitEdge(t, ctx, deniedEdge, "dropped")
}
