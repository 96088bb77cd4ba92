#!/usr/bin/env python3
"""How evenly three schedules spread a FlashAttention forward's (slice, query tile) items over the
SMs: the busiest SM's work against the average, with an item's work = its visible key tiles plus
a fixed per-item overhead (bench/RESULTS_flash.md, "Persistent forward, heaviest tiles first").

  blocks   one block an item in the launcher's order before eb324f9 (slice by slice, the last
           query tile first), each started on the SM that frees first, as the hardware issues
           blocks;
  static   one block an SM, SM k taking items k, k + SMs, ... of the work list;
  counter  one block an SM, each taking the next item of the work list when it is free (the
           kernel's atomic counter). Since eb324f9 a grid of one block an item is issued in the
           work list's order too (gridItem in kernels/flash_attention_common.cuh), which this
           column also models.

The work list: groups of `group` slices, each group's query tiles from the last to the first,
slice by slice (kernels/flash_attention_fwd_wgmma.cuh).

usage: flash_schedule_sim.py [--sms 132] [--overhead 0.5] [B H QUERY_TILES GROUP CAUSAL]...
"""
import argparse
import heapq


def work(tile, tiles, causal, overhead):
    return (tile + 1 if causal else tiles) + overhead


def worklist(slices, tiles, group):
    for first in range(0, slices, group):
        n = min(group, slices - first)
        for r in range(n * tiles):
            yield first + r % n, tiles - 1 - r // n


def greedy(items, sms):
    free = [0.0] * sms
    for w in items:
        heapq.heappush(free, heapq.heappop(free) + w)
    return max(free)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--overhead", type=float, default=0.5, help="per-item work beyond its key tiles, in key tiles")
    ap.add_argument("shapes", nargs="*", type=int, help="B H QUERY_TILES GROUP CAUSAL(0/1), repeated")
    a = ap.parse_args()
    shapes = a.shapes or [4, 16, 32, 8, 1, 4, 32, 22, 32, 1, 8, 8, 8, 64, 1, 8, 8, 8, 64, 0]
    assert len(shapes) % 5 == 0, "five numbers a shape"
    for i in range(0, len(shapes), 5):
        b, h, tiles, group, causal = shapes[i:i + 5]
        slices = b * h
        blocks = [work(t, tiles, causal, a.overhead) for s in range(slices) for t in range(tiles - 1, -1, -1)]
        listed = [work(t, tiles, causal, a.overhead) for s, t in worklist(slices, tiles, group)]
        sms = min(a.sms, len(listed))
        static = [0.0] * sms
        for n, w in enumerate(listed):
            static[n % sms] += w
        mean = sum(listed) / a.sms
        print(f"B{b} H{h} tiles {tiles} group {group} {'causal' if causal else 'full'}: busiest SM / mean: "
              f"blocks {greedy(blocks, a.sms) / mean:.3f}, static {max(static) / mean:.3f}, "
              f"counter {greedy(listed, a.sms) / mean:.3f}")


if __name__ == "__main__":
    main()
