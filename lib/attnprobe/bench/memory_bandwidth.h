#pragma once
// The machine's memory bandwidth, measured: `bench --queries last:W` reports a decode step's bytes read per
// second against it (a decode step reads K and V once, so memory, not arithmetic, bounds it).

namespace attnprobe {

/// Bytes per second of `threads` threads each streaming through its own share of a buffer far larger than
/// the last-level cache (256 MiB in all): `read` sums the floats (what a decode step does with K and V), the
/// copy moves them into a second buffer with memcpy and counts the bytes read and written. The best of the
/// passes made in about `seconds` (the buffers are allocated and first touched before the clock starts).
struct MemoryBandwidth {
  double read = 0;  ///< bytes read per second
  double copy = 0;  ///< bytes read + written per second (memcpy)
};
MemoryBandwidth measure_memory_bandwidth(int threads, double seconds = 0.3);

}  // namespace attnprobe
