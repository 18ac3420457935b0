#pragma once
// The collectives tensor parallelism needs between the ranks of one group, and the
// point-to-point messages of pipeline parallelism (docs/design/parallel.md). Every rank calls
// the same collectives in the same order with the same sizes; a recv takes the messages of
// its peer in the order they were sent, and must name the size the peer sent. Pointers are
// in the memory of the backend the communicator serves (host memory for the in-process
// group; device memory for NCCL, where each call is queued on that backend's stream, after
// the ops issued before it and before those issued after it).
#include <cstdint>
#include <string>

namespace tessera {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string describe() const = 0;  // "local 2/4", "nccl 2/8 (node 1)" ...

  // data[i] = the sum over ranks of data[i], in place; every rank gets the same bits.   data: [n]
  virtual void all_reduce_sum(float* data, int64_t n) = 0;
  // recv[r * n + i] = rank r's send[i].      send: [n]; recv: [size() * n] (send may be recv + rank() * n)
  virtual void all_gather(const float* send, float* recv, int64_t n) = 0;
  // Rank root's `bytes` at data to every rank's data.
  virtual void broadcast(void* data, int64_t bytes, int root) = 0;
  // Returns once every rank has called it (and, on a device, the queued work before it is done).
  virtual void barrier() = 0;
  // Pipeline stages: rank `peer` gets data[0..n) from this rank's next recv() from it.
  // May return before the peer receives (the in-process group buffers the message; NCCL
  // queues it on the stream): data may be reused once it returns.     data: [n]
  virtual void send(const float* data, int64_t n, int peer) = 0;
  // The next message rank `peer` sent to this rank, into data; it must be n elements. data: [n]
  virtual void recv(float* data, int64_t n, int peer) = 0;
};

}  // namespace tessera
