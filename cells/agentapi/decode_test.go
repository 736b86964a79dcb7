package agentapi_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"

	"github.com/cellium/cellium/cells/agentapi"
)

func TestDecodeJSONRejects(t *testing.T) {
	a := startAPI(t)
	tests := []struct {
		name, body string
		code       int
		want       string
	}{
		{"ok", `{"name":"x"}`, 201, ""},
		{"ok with trailing white space", "{\"name\":\"x\"}\n\t ", 201, ""},
		{"unknown field", `{"name":"x","extra":1}`, 400, `decode thing: json: unknown field "extra"`},
		{"trailing object", `{"name":"x"}{"name":"y"}`, 400, "unexpected data after the JSON object"},
		{"trailing garbage", `{"name":"x"} junk`, 400, "unexpected data after the JSON object"},
		{"trailing close brace", `{"name":"x"}}`, 400, "unexpected data after the JSON object"},
		{"empty body", ``, 400, "empty body: send a JSON object"},
		{"not JSON", `name=x`, 400, "decode thing: invalid character"},
		{"wrong type", `{"name":1}`, 400, "cannot unmarshal number"},
		{"validator", `{"name":"123456789"}`, 400, "decode thing: name is too long"},
		{"over the limit", `{"name":"` + strings.Repeat("x", agentapi.MaxRequestBodyBytes) + `"}`, 413,
			fmt.Sprintf("body is larger than the limit of %d bytes", agentapi.MaxRequestBodyBytes)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a.t = t
			code, body := a.do("PUT", "/v1/thing", tt.body)
			if code != tt.code {
				t.Fatalf("PUT = %d %q, want %d", code, body, tt.code)
			}
			if tt.want != "" {
				if msg := errorMessage(t, body); !strings.Contains(msg, tt.want) {
					t.Errorf("message %q lacks %q", msg, tt.want)
				}
			}
		})
	}
}

// endless is a body that never ends: `{"name":"xxxx...`; it counts what
// was read from it.
type endless struct {
	n     int64
	limit int64
}

func (e *endless) Read(p []byte) (int, error) {
	if e.n >= e.limit {
		return 0, io.EOF
	}
	if int64(len(p)) > e.limit-e.n {
		p = p[:e.limit-e.n]
	}
	for i := range p {
		p[i] = 'x'
	}
	if e.n == 0 && len(p) >= 9 {
		copy(p, `{"name":"`)
	}
	e.n += int64(len(p))
	return len(p), nil
}

// TestDecodeJSONStopsReadingAtLimit sends a 200 MB body of unknown length
// (so the Content-Length check cannot refuse it up front) and checks that
// the decoder reads no more than the limit plus a buffer, and allocates
// far less than the body.
func TestDecodeJSONStopsReadingAtLimit(t *testing.T) {
	const size = 200 << 20
	body := &endless{limit: size}
	r := httptest.NewRequest("PUT", "/v1/thing", io.NopCloser(body))
	r.ContentLength = -1
	w := httptest.NewRecorder()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	var v struct{ Name string }
	if agentapi.DecodeJSON(w, r, "thing", &v) {
		t.Fatal("a 200 MB body was accepted")
	}
	runtime.ReadMemStats(&after)
	if w.Code != http.StatusRequestEntityTooLarge {
		t.Errorf("code = %d, want 413", w.Code)
	}
	if slack := int64(64 << 10); body.n > agentapi.MaxRequestBodyBytes+slack {
		t.Errorf("read %d bytes of the body, want at most the limit %d plus %d", body.n, agentapi.MaxRequestBodyBytes, slack)
	}
	allocated := after.TotalAlloc - before.TotalAlloc
	t.Logf("read %d bytes, allocated %d bytes for a %d-byte body", body.n, allocated, size)
	if allocated > 32<<20 {
		t.Errorf("decoding allocated %d bytes: the body is being buffered", allocated)
	}
}

// TestBodyLimitOverSocket sends headers announcing 200 MB, and a chunked
// body without end, to the real server: both get 413 without the server
// waiting for the body.
func TestBodyLimitOverSocket(t *testing.T) {
	a := startAPI(t)
	for _, tc := range []struct{ name, header string }{
		{"content-length", "Content-Length: 209715200\r\n"},
		{"chunked", "Transfer-Encoding: chunked\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := net.Dial("unix", a.socket)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if _, err := io.WriteString(conn, "PUT /v1/thing HTTP/1.1\r\nHost: agent\r\nContent-Type: application/json\r\n"+tc.header+"\r\n"); err != nil {
				t.Fatal(err)
			}
			done := make(chan struct{})
			if tc.name == "chunked" {
				// Keep sending until the server hangs up.
				go func() {
					defer close(done)
					chunk := fmt.Sprintf("%x\r\n%s\r\n", 64<<10, strings.Repeat("x", 64<<10))
					if _, err := io.WriteString(conn, fmt.Sprintf("9\r\n%s\r\n", `{"name":"`)); err != nil {
						return
					}
					for i := 0; i < 200*16; i++ {
						if _, err := io.WriteString(conn, chunk); err != nil {
							return
						}
					}
				}()
			} else {
				close(done)
			}
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatalf("read response: %v", err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusRequestEntityTooLarge {
				t.Errorf("status = %d, want 413", resp.StatusCode)
			}
			conn.Close()
			<-done
		})
	}
}
