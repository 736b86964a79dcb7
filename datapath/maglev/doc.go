// Package maglev computes Maglev lookup tables (Eisenbud et al., "Maglev:
// A Fast and Reliable Software Network Load Balancer", NSDI 2016) for the
// kube-proxy replacement's backend selection of traffic from outside the
// node (--bpf-lb-algorithm=maglev, as in Cilium): a table of M slots per
// frontend, each holding a backend ID, in which every backend has about
// M/N slots and which changes little when a backend comes or goes.
// bpf/nodeport.c hashes a connection's 5-tuple into the table; the table
// depends only on the backends' addresses, the table size and the hash
// seed, so every node with the same flags picks the same backend for a
// connection.
//
// It also holds the flags that choose the algorithm (Config). It is plain
// Go: datapath/lbsync writes the tables into the BPF maps.
package maglev
