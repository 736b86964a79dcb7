package harness

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// AuditLogFile is the name of the API server's audit log in the work
// directory (with [Options.AuditPolicy]).
const AuditLogFile = "audit.log"

const auditPolicyFile = "audit-policy.yaml"

// AuditLogPath is the path of the API server's audit log; the file exists
// only with [Options.AuditPolicy], once the first event is logged.
func (c *Cluster) AuditLogPath() string { return filepath.Join(c.dir, AuditLogFile) }

// AuditEvent is the part of an audit.k8s.io/v1 Event that tests count
// requests by.
type AuditEvent struct {
	// AuditID is the request's ID (its events of several stages share it).
	AuditID string `json:"auditID"`
	// Stage is RequestReceived, ResponseStarted, ResponseComplete or Panic.
	Stage string `json:"stage"`
	// Verb is the request's verb: get, list, watch, create, update, patch,
	// delete, deletecollection.
	Verb string `json:"verb"`
	// User is who sent it; User.Username of a ServiceAccount's token is
	// system:serviceaccount:<namespace>:<name>.
	User struct {
		Username string   `json:"username"`
		Groups   []string `json:"groups"`
	} `json:"user"`
	// UserAgent is the client's User-Agent header.
	UserAgent string `json:"userAgent"`
	// ObjectRef names the object (nil for non-resource requests).
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
		Namespace   string `json:"namespace"`
		Name        string `json:"name"`
		APIGroup    string `json:"apiGroup"`
	} `json:"objectRef"`
	// ResponseStatus.Code is the HTTP status of the response.
	ResponseStatus *struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
}

// Resource is the object's resource, with "/subresource" if any ("" when
// the event has no object).
func (e *AuditEvent) Resource() string {
	if e.ObjectRef == nil {
		return ""
	}
	if e.ObjectRef.Subresource != "" {
		return e.ObjectRef.Resource + "/" + e.ObjectRef.Subresource
	}
	return e.ObjectRef.Resource
}

// Code is the response's HTTP status, 0 if the event has none.
func (e *AuditEvent) Code() int {
	if e.ResponseStatus == nil {
		return 0
	}
	return e.ResponseStatus.Code
}

// ReadAuditLog reads the events of an audit log written in JSON
// ([Cluster.AuditLogPath]). A missing file has no events.
//
// Errors: the file cannot be read, or a line is not an event.
func ReadAuditLog(path string) ([]AuditEvent, error) {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read audit log: %w", err)
	}
	defer f.Close()
	var out []AuditEvent
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for n := 1; sc.Scan(); n++ {
		if len(sc.Bytes()) == 0 {
			continue
		}
		var e AuditEvent
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, fmt.Errorf("read audit log %s, line %d: %w", path, n, err)
		}
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read audit log %s: %w", path, err)
	}
	return out, nil
}
