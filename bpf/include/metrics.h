/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * metrics.h: the per-reason, per-direction packet and byte counters of
 * cellium_metrics, shared by every program that passes or drops packets.
 */
#ifndef CELLIUM_METRICS_H
#define CELLIUM_METRICS_H

#include "maps.h"

/* count adds one packet of bytes to the counters of (reason, dir). */
static __always_inline void count(__u32 bytes, __u8 reason, __u8 dir)
{
	struct metrics_key key = { .reason = reason, .dir = dir };
	struct metrics_value *v = map_lookup_elem(&cellium_metrics, &key);

	if (!v) {
		struct metrics_value init = { .packets = 1, .bytes = bytes };

		if (map_update_elem(&cellium_metrics, &key, &init, BPF_NOEXIST) != -EEXIST)
			return;
		/* Another CPU made the entry first. */
		v = map_lookup_elem(&cellium_metrics, &key);
		if (!v)
			return;
	}
	v->packets += 1;
	v->bytes += bytes;
}

#endif /* CELLIUM_METRICS_H */
