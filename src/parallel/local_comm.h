#pragma once
// An in-process communicator group: ranks are threads of one process, buffers are host
// memory (the CPU backend's). CPU tensor parallelism and the tests run on it. Sums are
// deterministic: element i is summed in rank order 0 + 1 + ... + (size-1) whichever thread
// does it, so every rank gets the same bits on every run.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "parallel/communicator.h"

namespace tessera {

class LocalGroup {
 public:
  explicit LocalGroup(int size);
  ~LocalGroup();
  LocalGroup(const LocalGroup&) = delete;
  LocalGroup& operator=(const LocalGroup&) = delete;

  int size() const { return size_; }
  // Rank r's communicator; each rank's thread calls only its own.
  Communicator& rank(int r);
  // Ends the group: every rank waiting in a collective, and every later call, throws
  // tessera::Error with `why` (a rank that failed calls it so that the others do not wait forever).
  void abort(const std::string& why);
  // Makes an aborted group usable again; only while no rank is inside a collective (every
  // rank's thread has returned from the failed step). The next collective starts afresh, and
  // messages sent but not received are dropped.
  void reset();

 private:
  friend class LocalCommunicator;
  enum class Op { AllReduce, AllGather, Broadcast, Barrier };
  struct Post {
    Op op = Op::Barrier;
    const void* src = nullptr;
    int64_t n = 0;  // elements (all_reduce_sum, all_gather) or bytes (broadcast)
    int root = -1;
  };
  // Posts this rank's call and waits for every rank's; the last to arrive checks that the
  // calls match and sizes the scratch. Throws on a mismatch or an abort.
  void enter(int rank, const Post& p);
  // Waits for every rank (a plain generation barrier); throws on an abort.
  void arrive(const std::function<void()>& last = {});
  std::string mismatch() const;  // "" when every rank's post matches rank 0's

  const int size_;
  std::vector<std::unique_ptr<Communicator>> comms_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  std::string aborted_;      // why, once aborted
  std::vector<Post> posts_;  // [size]
  std::string error_;        // the last enter()'s mismatch
  std::vector<float> scratch_;
  // Point-to-point messages, buffered: [from * size + to], oldest first.
  std::vector<std::deque<std::vector<float>>> mail_;
  // Sends a copy of data to `to`'s mailbox; takes the next message from `from` (waits).
  void post(int from, int to, const float* data, int64_t n);
  void take(int from, int to, float* data, int64_t n);
};

}  // namespace tessera
