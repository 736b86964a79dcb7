package metrics

import "errors"

// ErrUnknownMetric is returned by ParseSpecs for a name in --hubble-metrics
// that is not one of Hubble's metrics cellium has.
var ErrUnknownMetric = errors.New("unknown hubble metric")

// ErrBadOption is returned by ParseSpecs for an option of a metric that is
// unknown, empty, or has a value the option does not accept.
var ErrBadOption = errors.New("bad hubble metric option")
