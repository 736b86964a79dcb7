// Package ctgc garbage-collects the datapath's conntrack map
// (cellium_ct4). The map is a plain hash map that evicts nothing: when it
// is full, the programs fail to insert new connections and drop their
// packets (reason 155, "CT: Map insertion failed") instead of evicting
// other endpoints' established flows. Entries whose deadline has passed
// are dead to the programs already; GC deletes them so their room can be
// used again, and reports how full the map is.
//
// A pass lists the map, then deletes the expired entries it found, each
// after looking it up again (see GC.Run for the window that remains). It
// is plain Go over a small interface (Table, which *maps.CT4 implements);
// daemon/bpfmaps runs it as a timer job every --conntrack-gc-interval.
package ctgc
