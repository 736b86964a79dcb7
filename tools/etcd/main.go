// Command etcd runs the etcd server (go.etcd.io/etcd/server/v3/etcdmain) for
// cellium's test harness.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
