package hive

import (
	"slices"
	"strings"
	"sync"
	"time"
)

// Level is the health of a module or one of its parts.
type Level string

const (
	// LevelOK means working as intended.
	LevelOK Level = "ok"
	// LevelDegraded means failing, usually retrying.
	LevelDegraded Level = "degraded"
	// LevelStopped means no longer running.
	LevelStopped Level = "stopped"
)

// Health reports the health of one part of a module.
type Health interface {
	// OK marks the part healthy.
	OK(message string)
	// Degraded marks the part failing with err.
	Degraded(message string, err error)
	// Stopped marks the part as no longer running.
	Stopped(message string)
	// Scope returns a Health for a named sub-part ("module.name").
	Scope(name string) Health
}

// HealthStatus is the last report of one part.
type HealthStatus struct {
	ID      string    `json:"id"`
	Module  string    `json:"module"`
	Level   Level     `json:"level"`
	Message string    `json:"message,omitempty"`
	Error   string    `json:"error,omitempty"`
	Since   time.Time `json:"since"`
}

// HealthReporter reads the health of every part of the hive.
type HealthReporter interface {
	// Statuses returns every part's last report, ordered by id.
	Statuses() []HealthStatus
	// Modules returns one row per module: its worst part.
	Modules() []HealthStatus
}

type healthRegistry struct {
	mu       sync.Mutex
	statuses map[string]HealthStatus
	now      func() time.Time
}

func newHealthRegistry() *healthRegistry {
	return &healthRegistry{statuses: map[string]HealthStatus{}, now: time.Now}
}

func (r *healthRegistry) set(module, id string, level Level, msg string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := HealthStatus{ID: id, Module: module, Level: level, Message: msg, Since: r.now()}
	if err != nil {
		s.Error = err.Error()
	}
	if old, ok := r.statuses[id]; ok && old.Level == level && old.Message == s.Message && old.Error == s.Error {
		s.Since = old.Since
	}
	r.statuses[id] = s
}

func (r *healthRegistry) Statuses() []HealthStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]HealthStatus, 0, len(r.statuses))
	for _, s := range r.statuses {
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b HealthStatus) int { return strings.Compare(a.ID, b.ID) })
	return out
}

func severity(l Level) int {
	switch l {
	case LevelDegraded:
		return 2
	case LevelStopped:
		return 1
	}
	return 0
}

func (r *healthRegistry) Modules() []HealthStatus {
	worst := map[string]HealthStatus{}
	for _, s := range r.Statuses() {
		w, ok := worst[s.Module]
		if !ok || severity(s.Level) > severity(w.Level) {
			s.ID = s.Module
			worst[s.Module] = s
		}
	}
	out := make([]HealthStatus, 0, len(worst))
	for _, s := range worst {
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b HealthStatus) int { return strings.Compare(a.ID, b.ID) })
	return out
}

type scopedHealth struct {
	reg    *healthRegistry
	module string
	id     string
}

func (h scopedHealth) OK(msg string) { h.reg.set(h.module, h.id, LevelOK, msg, nil) }
func (h scopedHealth) Degraded(msg string, err error) {
	h.reg.set(h.module, h.id, LevelDegraded, msg, err)
}
func (h scopedHealth) Stopped(msg string) { h.reg.set(h.module, h.id, LevelStopped, msg, nil) }
func (h scopedHealth) Scope(name string) Health {
	id := name
	if h.id != "" {
		id = h.id + "." + name
	}
	return scopedHealth{reg: h.reg, module: h.module, id: id}
}
