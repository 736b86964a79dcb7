/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * maps.h: the structs and maps of cellium BPF ABI v1. Keep in step with
 * BPF-ABI and datapath/maps; every struct here gets a Go type through
 * bpf2go -type.
 */
#ifndef CELLIUM_MAPS_H
#define CELLIUM_MAPS_H

#include "bpf_api.h"
#include "abi.h"

/* cellium_ipcache: prefix -> identity. prefixlen counts the 32 bits of
 * pad1/pad2/family plus the address prefix. */
struct ipcache_key {
	__u32 prefixlen;
	__u16 pad1;
	__u8 pad2;
	__u8 family;
	__u32 ip[4];
};

/* flags: IPCACHE_F_*. cidr_id: the low 24 bits of the local-scope (1 << 24) identity of the
 * most specific prefix a policy CIDR rule names that holds this one, when
 * another source won the prefix (a pod's address inside an ipBlock); 0:
 * none. Policy is decided on it as well as on sec_identity. */
struct ipcache_value {
	__u32 sec_identity;
	__u32 tunnel_endpoint;
	__u8 flags;
	__u8 cidr_id[3];
};

/* cellium_lxc: local endpoint address -> endpoint. */
struct endpoint_key {
	__u32 ip[4];
	__u8 family;
	__u8 pad[3];
};

struct endpoint_info {
	__u32 ifindex;
	__u16 lxc_id;
	__u16 flags;
	__u8 mac[6];
	__u8 node_mac[6];
	__u32 sec_identity;
};

/* cellium_policy (per endpoint): the fields of statedb/policy.Key.
 * prefixlen = 40 + (protocol == 0 ? 0 : 8 + port prefix bits). */
struct policy_key {
	__u32 prefixlen;
	__u32 sec_label;
	__u8 egress;
	__u8 protocol;
	__be16 dport;
};

struct policy_entry {
	__u8 deny;
	__u8 lpm_prefix_length;
	__u16 pad;
	__u32 pad2;
};

/* cellium_ct4: one entry per connection, endpoint and admitting hook.
 * The tuple is in the orientation of the connection's first packet;
 * endpoint is the ENDPOINT_ID of the programs that made the entry, so an
 * entry one endpoint's packets made never admits another endpoint's
 * (bpf/README.md, "Conntrack"). */
struct ct4_key {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 dir;
	__u16 endpoint;
};

struct ct_entry {
	__u64 expires;     /* ktime_get_ns deadline */
	__u64 tx_packets;  /* in the direction of the first packet */
	__u64 rx_packets;  /* replies */
	__u32 src_identity; /* remote identity when the entry was made */
	__u16 flags;       /* CT_F_* */
	__be16 policy_dport; /* the port (ICMP: type) the policy saw */
	__u64 checked;     /* ktime_get_ns of the last policy check */
	/* Monitor aggregation: ktime seconds of the last trace of each
	 * direction and the report TCP flags each direction has traced. */
	__u32 last_tx_report;
	__u32 last_rx_report;
	__u8 tx_flags_seen;
	__u8 rx_flags_seen;
	/* The destination before the socket load balancer translated it
	 * (a ClusterIP and port), when the packet that made the entry was
	 * sent by a socket it translated; 0: none. */
	__be16 orig_dport;
	__be32 orig_daddr;
};

/* cellium_ipv4_frag_datagrams: the L4 ports of a fragmented datagram,
 * recorded from its first fragment, for the fragments after it. */
struct ipv4_frag_id {
	__be32 daddr;
	__be32 saddr;
	__be16 id;
	__u8 proto;
	__u8 pad;
};

struct ipv4_frag_l4ports {
	__be16 sport;
	__be16 dport;
	__be16 policy_dport;
	__u16 pad;
};

/* cellium_metrics: per-CPU packet and byte counters. */
struct metrics_key {
	__u8 reason;
	__u8 dir;
	__u16 pad;
};

struct metrics_value {
	__u64 packets;
	__u64 bytes;
};

/* cellium_events records, layout EVENT_VERSION (abi.h). Bytes 0-71 are
 * version 1's layout unchanged; version is its former padding. */
struct event {
	__u8 type;
	__u8 reason;
	__u8 dir;
	__u8 verdict;
	__u16 endpoint_id;
	__u8 proto;
	__u8 family;
	__u32 src_identity;
	__u32 dst_identity;
	__u32 saddr[4];
	__u32 daddr[4];
	__be16 sport;
	__be16 dport;
	__u32 ifindex;
	__u32 orig_len;
	__u8 version;   /* EVENT_VERSION */
	__u8 tcp_flags; /* TCP: the header's flags; 0 for a later fragment */
	__u8 icmp_type; /* ICMP: type (a later fragment: its first's) */
	__u8 icmp_code; /* ICMP: code (0 for a later fragment) */
	__u64 ktime_ns;
	__u8 flags;     /* EVENT_F_* */
	__u8 pad;
	__be16 orig_dport;
	__be32 orig_daddr;
};

/* The key and value of the socket load balancer's cellium_lb4_reverse_sk
 * (lb.h: struct lb4_reverse_sk_key, lb4_reverse_sk_value, same layout),
 * read here through cellium_lb4_reverse_sk_ref. */
struct sock_xlate_key {
	__u64 cookie;
	__be32 address;
	__be16 port;
	__u16 pad;
};

struct sock_xlate_value {
	__be32 address;
	__be16 port;
	__u8 proto;
	__u8 pad;
};

/* Puts struct event into the object's BTF, where bpf2go finds it (the
 * programs only ever reserve it in the ring buffer), in a section the
 * loader ignores, so it becomes neither a map nor a variable. */
const struct event *cellium_event_type SEC(".cellium.types");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct ipcache_key);
	__type(value, struct ipcache_value);
	__uint(max_entries, 512000);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cellium_ipcache SEC(".maps");

/* cellium_identities: the security identities of the cluster (the
 * identities table's numbers) -> 1. A tunnel packet's VNI must be one of
 * them or a reserved identity (bpf/overlay.c). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cellium_identities SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct endpoint_key);
	__type(value, struct endpoint_info);
	__uint(max_entries, 65535);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cellium_lxc SEC(".maps");

/* A template: the loader replaces it with the endpoint's own map,
 * pinned as cellium_policy_%05d. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct policy_key);
	__type(value, struct policy_entry);
	__uint(max_entries, 16384);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} cellium_policy SEC(".maps");

/* cellium_policy_progs: endpoint ID -> that endpoint's cil_lxc_policy.
 * cil_from_container tail-calls into it for a packet to a local endpoint,
 * which applies the destination's ingress policy and redirects the packet
 * into the destination pod (bpf_redirect_peer). An empty slot means the
 * packet goes through the stack and the destination's cil_to_container. */
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(__u32));
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cellium_policy_progs SEC(".maps");

/* A plain hash, not LRU: when it is full a new connection drops with 155
 * "CT: Map insertion failed" instead of evicting another pod's established
 * one; the agent's conntrack GC removes expired entries. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct ct4_key);
	__type(value, struct ct_entry);
	__uint(max_entries, 262144);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cellium_ct4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ipv4_frag_id);
	__type(value, struct ipv4_frag_l4ports);
	__uint(max_entries, 8192);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cellium_ipv4_frag_datagrams SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__type(key, struct metrics_key);
	__type(value, struct metrics_value);
	__uint(max_entries, 1024);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cellium_metrics SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cellium_events SEC(".maps");

/* cellium_events_lost counts, per CPU, the events the programs could not
 * put into cellium_events because it was full (the reader fell behind):
 * the agent reports them as Hubble LostEvents of source
 * PERF_EVENT_RING_BUFFER. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cellium_events_lost SEC(".maps");

/* events_lost counts one event that did not fit into cellium_events. */
static __always_inline void events_lost(void)
{
	__u32 key = 0;
	__u64 *n = map_lookup_elem(&cellium_events_lost, &key);

	if (n)
		*n += 1;
}

/* cellium_lb4_reverse_sk_ref: slot 0 holds the socket load balancer's
 * cellium_lb4_reverse_sk while it is on (datapath/maps OpenLB puts it
 * there, UnpinLB takes it out), so the veth programs can name the
 * ClusterIP a socket asked for (its cookie and backend -> frontend)
 * without the programs holding, or the node allocating, that map when the
 * socket load balancer is off (Documentation/concepts/service-flows.md). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, 1);
	__type(key, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__array(values, struct {
		__uint(type, BPF_MAP_TYPE_LRU_HASH);
		__uint(key_size, sizeof(struct sock_xlate_key));
		__uint(value_size, sizeof(struct sock_xlate_value));
		__uint(max_entries, 262144);
	});
} cellium_lb4_reverse_sk_ref SEC(".maps");

#endif /* CELLIUM_MAPS_H */
