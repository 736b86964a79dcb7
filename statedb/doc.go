// Package statedb holds cellium's shared state: the tables that cells
// meet through (in sub-packages grouped by domain) and the generic
// reconciler that turns desired rows into real state.
package statedb
