#pragma once
// Measured memory read bandwidth of this machine, for the floors printed by benchmarks.
namespace tessera {
class Backend;
// Bytes per second reading a buffer far larger than the caches with all backend threads.
double measure_read_bandwidth(Backend& backend);
}  // namespace tessera
