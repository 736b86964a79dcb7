// Package leaderelection is the operator cell that elects one leader among
// operator replicas through a coordination.k8s.io Lease, and runs the
// controllers (LeaderJob values) only while leading.
package leaderelection

import "github.com/cellium/cellium/cells/hive"

// Cell runs the election (or, with --leader-election=false, acts as leader
// at once) and the leader jobs contributed to the "leader-jobs" group.
var Cell = hive.Module("leader-election", "Operator leader election",
	hive.Config(DefaultConfig),
	// The elector's state, written only by the election loop.
	hive.ProvidePrivate(newElector),
	// Leadership tells others whether this replica leads.
	hive.Provide(leadership),
	// The election loop; the leader jobs start when elected.
	hive.Invoke(registerElection),
)
