package agentapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"

	apiclient "github.com/cellium/cellium/api/v1/client"
	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/cells/agentapi"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/hivetest"
	"github.com/cellium/cellium/cells/statedir"
)

// client returns an HTTP client that dials the unix socket.
func client(socket string) *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", socket)
	}}}
}

type api struct {
	t      *testing.T
	socket string
	c      *http.Client
}

// do sends a request and returns the status and the body.
func (a *api) do(method, path, body string) (int, string) {
	a.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, "http://agent"+path, rd)
	if err != nil {
		a.t.Fatal(err)
	}
	resp, err := a.c.Do(req)
	if err != nil {
		a.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		a.t.Fatal(err)
	}
	return resp.StatusCode, string(data)
}

// errorMessage decodes an models.Error body.
func errorMessage(t *testing.T, body string) string {
	t.Helper()
	var e models.Error
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Message == "" {
		t.Fatalf("body %q is not an API error: %v", body, err)
	}
	return e.Message
}

type thing struct {
	Name string `json:"name"`
}

func (t *thing) Validate() error {
	if len(t.Name) > 8 {
		return errors.New("name is too long")
	}
	return nil
}

type row struct{ ID string }

func (r row) TableHeader() []string { return []string{"ID"} }
func (r row) TableRow() []string    { return []string{r.ID} }

var rowIndex = statedb.Index[row, string]{
	Name:       "id",
	FromObject: func(r row) index.KeySet { return index.NewKeySet(index.String(r.ID)) },
	FromKey:    index.String,
	Unique:     true,
}

// startAPI starts the API cell with a state directory, a test module with
// handlers, a degraded health report and a table of two rows.
func startAPI(t *testing.T) *api {
	t.Helper()
	dir := t.TempDir()
	socket := filepath.Join(dir, "run", "api.sock")
	hivetest.Start(t, []string{"--state-dir=" + filepath.Join(dir, "state"), "--socket-path=" + socket},
		statedir.Cell,
		agentapi.Cell,
		hive.Module("test-things", "Things for the API test",
			hive.Provide(func() agentapi.HandlersOut {
				return agentapi.HandlersOut{Handlers: []agentapi.Handler{
					{Pattern: "PUT /thing", Handler: func(w http.ResponseWriter, r *http.Request) {
						var v thing
						if agentapi.DecodeJSON(w, r, "thing", &v) {
							agentapi.WriteJSONStatus(w, r, http.StatusCreated, v)
						}
					}},
					{Pattern: "GET /thing/{id}", Handler: func(w http.ResponseWriter, r *http.Request) {
						if n, ok := agentapi.PathUint(w, r, "id", "thing ID", 1, 4095); ok {
							agentapi.WriteJSON(w, r, map[string]uint64{"id": n})
						}
					}},
					{Pattern: "GET /things", Handler: func(w http.ResponseWriter, r *http.Request) {
						if owner, ok := agentapi.QueryString(w, r, "owner", 10, true); ok {
							agentapi.WriteJSON(w, r, map[string]string{"owner": owner})
						}
					}},
				}}
			}),
			hive.Invoke(func(h hive.Health, db *statedb.DB) error {
				h.Scope("part").Degraded("broken on purpose", errors.New("test fault"))
				tbl, err := statedb.NewTable(db, "test-rows", rowIndex)
				if err != nil {
					return err
				}
				txn := db.WriteTxn(tbl)
				tbl.Insert(txn, row{"a"})
				tbl.Insert(txn, row{"b"})
				txn.Commit()
				return nil
			}),
		),
	)
	return &api{t: t, socket: socket, c: client(socket)}
}

func TestRoutingAndErrors(t *testing.T) {
	a := startAPI(t)
	tests := []struct {
		method, path, body string
		code               int
		want               string // in the body
	}{
		{"PUT", "/v1/thing", `{"name":"x"}`, 201, `"name": "x"`},
		{"GET", "/v1/thing/7", "", 200, `"id": 7`},
		{"GET", "/v1/thing/7?format=yaml", "", 200, "id: 7"},
		{"GET", "/v1/nope", "", 404, "no such API path GET /v1/nope"},
		{"GET", "/thing/7", "", 404, "no such API path"},
		{"DELETE", "/v1/thing/7", "", 404, "no such API path DELETE /v1/thing/7"},
		{"GET", "/v1/thing/0", "", 400, `thing ID \"0\": want a number from 1 to 4095`},
		{"GET", "/v1/thing/4096", "", 400, `thing ID \"4096\": want a number from 1 to 4095`},
		{"GET", "/v1/thing/-1", "", 400, "want a number from 1 to 4095"},
		{"GET", "/v1/thing/65537", "", 400, "want a number from 1 to 4095"},
		{"GET", "/v1/thing/" + strings.Repeat("9", 200), "", 400, "...\\\": want a number"},
		{"GET", "/v1/things?owner=me", "", 200, `"owner": "me"`},
		{"GET", "/v1/things", "", 400, "owner is missing"},
		{"GET", "/v1/things?owner=" + strings.Repeat("o", 11), "", 400, "owner is 11 bytes long, the limit is 10"},
	}
	for _, tt := range tests {
		code, body := a.do(tt.method, tt.path, tt.body)
		if code != tt.code || !strings.Contains(body, tt.want) {
			t.Errorf("%s %s = %d %q, want %d with %q", tt.method, tt.path, code, body, tt.code, tt.want)
		}
		if code >= 400 {
			errorMessage(t, body)
		}
	}
}

func TestHealthHandler(t *testing.T) {
	a := startAPI(t)
	code, body := a.do("GET", "/v1/healthz", "")
	var h models.Health
	if err := json.Unmarshal([]byte(body), &h); code != 200 || err != nil {
		t.Fatalf("GET /v1/healthz = %d %q (%v)", code, body, err)
	}
	if h.State != "Degraded" {
		t.Errorf("state = %q, want Degraded: a module reported degraded", h.State)
	}
	var found bool
	for _, m := range h.Modules {
		if m.Module == "test-things" && m.Level == string(hive.LevelDegraded) {
			found = true
		}
	}
	if !found {
		t.Errorf("modules %+v do not show test-things degraded", h.Modules)
	}
	_, body = a.do("GET", "/v1/healthz?verbose=true", "")
	if !strings.Contains(body, "part") || !strings.Contains(body, "test fault") {
		t.Errorf("verbose health %q lacks the degraded part and its error", body)
	}
}

func TestStatedbHandler(t *testing.T) {
	a := startAPI(t)
	code, body := a.do("GET", "/v1/statedb", "")
	var tables []models.TableInfo
	if err := json.Unmarshal([]byte(body), &tables); code != 200 || err != nil {
		t.Fatalf("GET /v1/statedb = %d %q (%v)", code, body, err)
	}
	var got *models.TableInfo
	for i := range tables {
		if tables[i].Name == "test-rows" {
			got = &tables[i]
		}
	}
	if got == nil || got.Objects != 2 || len(got.Indexes) == 0 {
		t.Fatalf("tables %+v: want test-rows with 2 objects and its indexes", tables)
	}
	code, body = a.do("GET", "/v1/statedb/test-rows", "")
	var rows []row
	if err := json.Unmarshal([]byte(body), &rows); code != 200 || err != nil || len(rows) != 2 || rows[0].ID != "a" {
		t.Fatalf("GET /v1/statedb/test-rows = %d %q (%v), want rows a and b", code, body, err)
	}
	code, body = a.do("GET", "/v1/statedb/nope", "")
	if msg := errorMessage(t, body); code != 404 || !strings.Contains(msg, `no table "nope"`) || !strings.Contains(msg, "test-rows") {
		t.Errorf("GET /v1/statedb/nope = %d %q, want 404 listing the tables", code, msg)
	}
}

func TestStatedbChangesHandler(t *testing.T) {
	a := startAPI(t)
	c := apiclient.New(a.socket)
	defer c.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	s, err := c.WatchStatedbTable(ctx, "test-rows")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var got []string
	for range 2 {
		ch, err := s.Next()
		if err != nil {
			t.Fatal(err)
		}
		var r row
		if err := json.Unmarshal(ch.Object, &r); err != nil || ch.Revision == 0 || ch.Deleted {
			t.Fatalf("change %+v (%v): want an inserted row", ch, err)
		}
		got = append(got, r.ID)
	}
	if strings.Join(got, ",") != "a,b" {
		t.Errorf("rows %v, want a and b", got)
	}
	if _, err := c.WatchStatedbTable(ctx, "nope"); apiclient.StatusCode(err) != 404 {
		t.Errorf("changes of an unknown table: %v, want a 404", err)
	}
}

func TestDuplicateRouteFailsStart(t *testing.T) {
	dir := t.TempDir()
	h := hivetest.New(t, []string{"--socket-path=" + filepath.Join(dir, "s.sock")},
		agentapi.Cell,
		hive.Provide(func() agentapi.HandlersOut {
			f := func(http.ResponseWriter, *http.Request) {}
			return agentapi.HandlersOut{Handlers: []agentapi.Handler{{Pattern: "GET /x", Handler: f}, {Pattern: "GET /x", Handler: f}}}
		}),
	)
	err := h.Start(context.Background())
	if err == nil {
		_ = h.Stop(context.Background())
		t.Fatal("start with two handlers for GET /x succeeded")
	}
	if !strings.Contains(err.Error(), `register API handler "GET /v1/x"`) {
		t.Errorf("error %v does not name the handler", err)
	}
}
