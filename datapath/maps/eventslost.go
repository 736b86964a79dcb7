package maps

import (
	"fmt"

	"github.com/cilium/ebpf"
)

// EventsLost is cellium_events_lost: per CPU, the events the programs
// could not put into the event ring buffer because it was full.
type EventsLost struct{ m *ebpf.Map }

// Map returns the underlying map.
func (l *EventsLost) Map() *ebpf.Map { return l.m }

// Read returns the events lost so far, summed over CPUs.
//
// Errors: the map's lookup error, wrapped.
func (l *EventsLost) Read() (uint64, error) {
	var per []uint64
	if err := l.m.Lookup(uint32(0), &per); err != nil {
		return 0, fmt.Errorf("read %s: %w", EventsLostMapName, err)
	}
	var n uint64
	for _, v := range per {
		n += v
	}
	return n, nil
}
