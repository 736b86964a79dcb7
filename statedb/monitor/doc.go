// Package monitor is the node's hub of datapath events, what `cellium
// monitor` shows: drops with their reason, policy verdicts and traces. The
// datapath publishes the events it reads from the BPF ring buffer; the
// agent API subscribes one reader per client. It sits under statedb/ so
// that both sides can import it: control-plane cells never import
// datapath/, and the datapath never imports cells/.
//
// A Hub never blocks its publisher: each subscriber has a bounded buffer,
// and an event that does not fit is dropped for that subscriber alone and
// counted (Subscription.Lost). The hub starts no goroutine.
package monitor
