#pragma once
// Process-wide allocator settings for the command-line tool.

namespace attnprobe {

/// Keeps memory that is freed inside the process for the next allocation instead of returning it to
/// the kernel (glibc: blocks below 32 MiB come from the heap, and the heap is trimmed only past
/// 256 MiB free). Estimator calls allocate and free the same few MiB of temporaries call after call
/// (Nyström's L × L float64 factors and recorded rotations, YOSO's tables); with glibc's default,
/// adaptive thresholds those pages went back to the kernel at each free and were faulted in and zeroed
/// again at the next call: 426 page faults per nystrom(L=256) call at n = 4096, 13–16% of its time.
/// The peak resident size does not change; what is kept is at most what was in use before. Called once
/// by the attnprobe executable, before any thread starts; a no-op with other C libraries. Not called
/// by the Python module: the allocator of a user's interpreter is theirs to tune.
void keep_freed_memory();

}  // namespace attnprobe
