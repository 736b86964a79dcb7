// Package tables holds the few helpers every reader of a statedb table
// needs, whatever the table: waiting for tables to be initialized (their
// first list from the API server, their restore from disk) before acting on
// their contents.
package tables
