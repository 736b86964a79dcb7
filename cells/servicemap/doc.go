// Package servicemap draws a live service map of the cluster in the
// browser: it reads Hubble flows from hubble-relay (or one agent's Hubble
// socket) with the Observer API's GetFlows, folds them into a bounded graph
// of workloads (nodes) and the connections between them (edges, with
// forwarded and dropped counts and the policies that decided), and serves
// that graph read-only over HTTP: an HTML page drawn with inline SVG, the
// graph as JSON and a Server-Sent Events stream that pushes it as it
// changes. The operator runs it behind --hubble-service-map-listen-address.
package servicemap
