// Package lbevents reports the Services (and pods' hostPorts) the load
// balancer does not serve as asked: it follows the lb-service-states
// table that datapath/lbsync's deriver keeps (a Service refused because it
// does not fit the maps or its frontend has another owner, a Service whose
// EndpointSlices had endpoints skipped) and writes a Warning Event on the
// Service or pod for each new state or message, and a log line. The row
// itself stays visible in `cellium service list` while the state lasts.
package lbevents
