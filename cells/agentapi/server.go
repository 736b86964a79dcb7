package agentapi

import (
	"encoding/json"
	"fmt"
	"iter"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"

	"github.com/cilium/statedb"
	"sigs.k8s.io/yaml"

	"github.com/cellium/cellium/api/v1/models"
	"github.com/cellium/cellium/cells/hive"
	"github.com/cellium/cellium/cells/hive/httpserve"
	"github.com/cellium/cellium/cells/statedir"
	"github.com/cellium/cellium/statedb/health"
)

// APIVersionPrefix prefixes every path of the API.
const APIVersionPrefix = "/v1"

// Handler is one route of the API. Pattern is a net/http pattern below
// /v1, e.g. "GET /endpoint/{id}".
type Handler struct {
	Pattern string
	Handler http.HandlerFunc
}

// HandlersOut contributes handlers to the API server from a constructor.
type HandlersOut struct {
	hive.Out
	Handlers []Handler `group:"agent-api-handlers,flatten"`
}

// WriteError writes a models.Error with the HTTP status code.
func WriteError(w http.ResponseWriter, code int, format string, args ...any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(models.Error{Code: code, Message: fmt.Sprintf(format, args...)})
}

// WriteJSON writes v as JSON with status 200, or as YAML when the request
// asks for it (?format=yaml).
func WriteJSON(w http.ResponseWriter, r *http.Request, v any) {
	WriteJSONStatus(w, r, http.StatusOK, v)
}

// WriteJSONStatus is WriteJSON with another status code.
func WriteJSONStatus(w http.ResponseWriter, r *http.Request, code int, v any) {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		WriteError(w, http.StatusInternalServerError, "encode response: %v", err)
		return
	}
	if r != nil && r.URL.Query().Get("format") == "yaml" {
		if data, err = yaml.JSONToYAML(data); err != nil {
			WriteError(w, http.StatusInternalServerError, "encode response as YAML: %v", err)
			return
		}
		w.Header().Set("Content-Type", "application/yaml")
	} else {
		w.Header().Set("Content-Type", "application/json")
	}
	w.WriteHeader(code)
	_, _ = w.Write(append(data, '\n'))
}

type serverParams struct {
	hive.In
	Config    Config
	Lifecycle hive.Lifecycle
	Log       *slog.Logger
	Handlers  []Handler `group:"agent-api-handlers"`
	// StateDir is not used; depending on it orders the state directory's
	// lock (taken by its start hook) before the socket is touched, so a
	// second agent on the node stops at the lock.
	StateDir statedir.Dir `optional:"true"`
}

func registerServer(p serverParams) error {
	mux := http.NewServeMux()
	for _, h := range p.Handlers {
		method, path, ok := strings.Cut(h.Pattern, " ")
		if !ok {
			method, path = "", h.Pattern
		}
		pattern := strings.TrimSpace(method + " " + APIVersionPrefix + path)
		if err := registerSafely(mux, pattern, h.Handler); err != nil {
			return err
		}
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		WriteError(w, http.StatusNotFound, "no such API path %s %s", r.Method, r.URL.Path)
	})
	// The listener removes the socket when it closes, if the file is
	// still the one it created.
	p.Lifecycle.Append(httpserve.Hook("agent-api", func() (net.Listener, error) {
		return Listen(p.Config.SocketPath)
	}, mux, p.Log, nil))
	return nil
}

func registerSafely(mux *http.ServeMux, pattern string, h http.HandlerFunc) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("register API handler %q: %v", pattern, r)
		}
	}()
	mux.HandleFunc(pattern, h)
	return nil
}

type healthParams struct {
	hive.In
	Reporter hive.HealthReporter
	DB       *statedb.DB
	// Probes is absent when the agent does not probe its health endpoint.
	Probes statedb.Table[*health.Probe] `optional:"true"`
	// NodePaths are the probes of the other nodes; absent with Probes.
	NodePaths statedb.Table[*health.NodePath] `optional:"true"`
}

func healthHandlers(p healthParams) HandlersOut {
	return HandlersOut{Handlers: []Handler{{
		Pattern: "GET /healthz",
		Handler: func(w http.ResponseWriter, r *http.Request) {
			mods := p.Reporter.Modules()
			if r.URL.Query().Get("verbose") == "true" {
				mods = p.Reporter.Statuses()
			}
			m := HealthModel(mods)
			if p.Probes != nil {
				txn := p.DB.ReadTxn()
				m.ClusterHealth = ClusterHealthModel(p.Probes.All(txn))
				if p.NodePaths != nil {
					AddNodeHealth(m.ClusterHealth, statedb.Collect(p.NodePaths.All(txn)))
				}
			}
			WriteJSON(w, r, m)
		},
	}}}
}

// ClusterHealthModel is the cluster-health of GET /v1/healthz for the
// given rows of the health-probes table.
func ClusterHealthModel(probes iter.Seq2[*health.Probe, statedb.Revision]) *models.ClusterHealth {
	out := &models.ClusterHealth{Probes: []models.HealthProbe{}}
	for p := range probes {
		hp := models.HealthProbe{Name: p.Name, Reachable: p.Reachable, Error: p.Error, Latency: p.Latency, LastProbed: p.LastProbed}
		if p.IP.IsValid() {
			hp.IP = p.IP.String()
		}
		if !p.LastReachable.IsZero() {
			t := p.LastReachable
			hp.LastReachable = &t
		}
		out.Total++
		if p.Reachable {
			out.Reachable++
		}
		out.Probes = append(out.Probes, hp)
	}
	return out
}

// AddNodeHealth adds the other nodes' probes (rows of the node-health
// table) to ch, and counts them.
func AddNodeHealth(ch *models.ClusterHealth, rows []*health.NodePath) {
	byNode := map[string]*models.NodeHealth{}
	var names []string
	for _, r := range rows {
		n := byNode[r.Node]
		if n == nil {
			n = &models.NodeHealth{Name: r.Node, Status: NodeStatusReachable}
			byNode[r.Node] = n
			names = append(names, r.Node)
		}
		ph := models.NodePathHealth{Type: r.Type, Protocol: r.Protocol, IP: r.IP.String(), Probed: r.Probed,
			Reachable: r.Reachable, Error: r.Error, Latency: r.Latency}
		if !r.LastProbed.IsZero() {
			t := r.LastProbed
			ph.LastProbed = &t
		}
		if !r.LastReachable.IsZero() {
			t := r.LastReachable
			ph.LastReachable = &t
		}
		n.Paths = append(n.Paths, ph)
		switch {
		case r.Probed && !r.Reachable:
			n.Status = NodeStatusUnreachable
		case !r.Probed && n.Status != NodeStatusUnreachable:
			n.Status = NodeStatusUnknown
		}
	}
	slices.Sort(names)
	for _, name := range names {
		n := byNode[name]
		slices.SortFunc(n.Paths, func(a, b models.NodePathHealth) int {
			return strings.Compare(a.Type+"/"+a.Protocol, b.Type+"/"+b.Protocol)
		})
		ch.Total++
		if n.Status == NodeStatusReachable {
			ch.Reachable++
		}
		ch.Nodes = append(ch.Nodes, *n)
	}
}

// Values of models.NodeHealth.Status.
const (
	NodeStatusReachable   = "reachable"
	NodeStatusUnreachable = "unreachable"
	NodeStatusUnknown     = "unknown"
)

// HealthModel is the body of GET /v1/healthz for the given module
// reports: State is "Ok" when none is degraded, else "Degraded".
func HealthModel(mods []hive.HealthStatus) models.Health {
	resp := models.Health{State: models.HealthStateOK}
	if mods != nil {
		resp.Modules = make([]models.ModuleHealth, len(mods))
	}
	for i, m := range mods {
		if m.Level == hive.LevelDegraded {
			resp.State = "Degraded"
		}
		resp.Modules[i] = models.ModuleHealth{ID: m.ID, Module: m.Module, Level: string(m.Level),
			Message: m.Message, Error: m.Error, Since: m.Since}
	}
	return resp
}

func statedbHandlers(db *statedb.DB) HandlersOut {
	changes := db.HTTPHandler()
	return HandlersOut{Handlers: []Handler{
		{
			Pattern: "GET /statedb",
			Handler: func(w http.ResponseWriter, r *http.Request) {
				txn := db.ReadTxn()
				var out []models.TableInfo
				for _, t := range db.GetTables(txn) {
					init, _ := t.Initialized(txn)
					out = append(out, models.TableInfo{Name: t.Name(), Objects: t.NumObjects(txn), Initialized: init,
						Pending: t.PendingInitializers(txn), Indexes: t.Indexes()})
				}
				slices.SortFunc(out, func(a, b models.TableInfo) int { return strings.Compare(a.Name, b.Name) })
				WriteJSON(w, r, out)
			},
		},
		{
			Pattern: "GET /statedb/{table}",
			Handler: func(w http.ResponseWriter, r *http.Request) {
				name := r.PathValue("table")
				txn := db.ReadTxn()
				if db.GetTable(txn, name) == nil {
					var names []string
					for _, t := range db.GetTables(txn) {
						names = append(names, t.Name())
					}
					slices.Sort(names)
					WriteError(w, http.StatusNotFound, "no table %q; tables: %s", name, strings.Join(names, ", "))
					return
				}
				var buf strings.Builder
				if err := txn.WriteJSON(&buf, name); err != nil {
					WriteError(w, http.StatusInternalServerError, "dump table %s: %v", name, err)
					return
				}
				// WriteJSON emits {"table": [objects...]}; return the objects.
				var dump map[string]json.RawMessage
				if err := json.Unmarshal([]byte(buf.String()), &dump); err != nil {
					WriteError(w, http.StatusInternalServerError, "decode dump of %s: %v", name, err)
					return
				}
				objs := dump[name]
				if objs == nil {
					objs = json.RawMessage("[]")
				}
				WriteJSON(w, r, objs)
			},
		},
		{
			// The table's changes as a stream of JSON objects, one a line
			// ({"obj":..., "rev":..., "deleted":...}): every row
			// first, then each change as it commits, with an empty
			// keep-alive object every 30 s, until the client goes away.
			// statedb's own changes handler: `cellium` has no command for
			// it; the scale tool (test/scale) watches the ipcache with it.
			Pattern: "GET /statedb/{table}/changes",
			Handler: func(w http.ResponseWriter, r *http.Request) {
				name := r.PathValue("table")
				if db.GetTable(db.ReadTxn(), name) == nil {
					WriteError(w, http.StatusNotFound, "no table %q", name)
					return
				}
				r2 := r.Clone(r.Context())
				r2.URL.Path = "/changes/" + name
				r2.URL.RawPath = ""
				changes.ServeHTTP(w, r2)
			},
		},
	}}
}
