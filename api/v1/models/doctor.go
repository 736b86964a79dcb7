package models

// DoctorReport is GET /v1/doctor and `cellium doctor -o json`: every
// disagreement the agent finds between its endpoints and what should
// match them. An empty Findings list (never null) means the node is clean.
type DoctorReport struct {
	// Findings are the disagreements, sorted by kind then object.
	Findings []DoctorFinding `json:"findings"`
	// Skipped lists the checks that could not run, each with the reason
	// (for example the pods table is not synced yet).
	Skipped []string `json:"skipped,omitempty"`
}

// DoctorFinding is one disagreement.
type DoctorFinding struct {
	// Kind names the check that failed, e.g. "leaked-ip", "orphan-veth";
	// Documentation/operations/troubleshooting.md lists them.
	Kind string `json:"kind"`
	// Object is what the finding is about: an IP, an interface, a file,
	// "endpoint 42", "cep default/web-0".
	Object string `json:"object"`
	// Message says what is wrong and what it means.
	Message string `json:"message"`
	// Hint says what to do about it.
	Hint string `json:"hint"`
}
