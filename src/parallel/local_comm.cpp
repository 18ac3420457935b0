#include "parallel/local_comm.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "core/error.h"

namespace tessera {

namespace {
const char* op_name(int op) {
  static const char* names[] = {"all_reduce_sum", "all_gather", "broadcast", "barrier"};
  return names[op];
}
}  // namespace

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(LocalGroup& g, int rank) : g_(g), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return g_.size_; }
  std::string describe() const override { return "local " + std::to_string(rank_) + "/" + std::to_string(g_.size_); }

  void all_reduce_sum(float* data, int64_t n) override {
    TESSERA_CHECK(n >= 0 && (data || n == 0), "all_reduce_sum: rank ", rank_, " passed ", n, " elements at ",
                  static_cast<const void*>(data));
    g_.enter(rank_, {LocalGroup::Op::AllReduce, data, n, -1});
    // Each rank sums its own chunk of the elements, every element in rank order.
    const int size = g_.size_;
    const int64_t b = n * rank_ / size, e = n * (rank_ + 1) / size;
    float* out = g_.scratch_.data();
    for (int64_t i = b; i < e; ++i) {
      float s = static_cast<const float*>(g_.posts_[0].src)[i];
      for (int r = 1; r < size; ++r) s += static_cast<const float*>(g_.posts_[r].src)[i];
      out[i] = s;
    }
    g_.arrive();  // every chunk summed; the inputs were read
    if (n > 0) std::memcpy(data, out, sizeof(float) * static_cast<size_t>(n));
    // The scratch is rewritten only after the next enter(), which every rank reaches after this copy.
  }

  void all_gather(const float* send, float* recv, int64_t n) override {
    TESSERA_CHECK(n >= 0 && ((send && recv) || n == 0), "all_gather: rank ", rank_, " passed ", n, " elements");
    g_.enter(rank_, {LocalGroup::Op::AllGather, send, n, -1});
    for (int r = 0; r < g_.size_; ++r) {
      const float* src = static_cast<const float*>(g_.posts_[r].src);
      float* dst = recv + static_cast<int64_t>(r) * n;
      if (src != dst && n > 0) std::memcpy(dst, src, sizeof(float) * static_cast<size_t>(n));
    }
    g_.arrive();  // every rank has read every send buffer: they may change now
  }

  void broadcast(void* data, int64_t bytes, int root) override {
    TESSERA_CHECK(root >= 0 && root < g_.size_, "broadcast: root ", root, " is not a rank of a group of ", g_.size_);
    TESSERA_CHECK(bytes >= 0 && (data || bytes == 0), "broadcast: rank ", rank_, " passed ", bytes, " bytes");
    g_.enter(rank_, {LocalGroup::Op::Broadcast, data, bytes, root});
    if (rank_ != root && bytes > 0) std::memcpy(data, g_.posts_[root].src, static_cast<size_t>(bytes));
    g_.arrive();
  }

  void barrier() override { g_.enter(rank_, {LocalGroup::Op::Barrier, nullptr, 0, -1}); }

  void send(const float* data, int64_t n, int peer) override {
    TESSERA_CHECK(peer >= 0 && peer < g_.size_ && peer != rank_, "send: rank ", rank_, " to rank ", peer,
                  " of a group of ", g_.size_);
    TESSERA_CHECK(n >= 0 && (data || n == 0), "send: rank ", rank_, " passed ", n, " elements");
    g_.post(rank_, peer, data, n);
  }
  void recv(float* data, int64_t n, int peer) override {
    TESSERA_CHECK(peer >= 0 && peer < g_.size_ && peer != rank_, "recv: rank ", rank_, " from rank ", peer,
                  " of a group of ", g_.size_);
    TESSERA_CHECK(n >= 0 && (data || n == 0), "recv: rank ", rank_, " passed ", n, " elements");
    g_.take(peer, rank_, data, n);
  }

 private:
  LocalGroup& g_;
  const int rank_;
};

LocalGroup::LocalGroup(int size) : size_(size) {
  TESSERA_CHECK(size >= 1 && size <= 1024, "local communicator group: size ", size, " is outside [1, 1024]");
  posts_.resize(size);
  mail_.resize(static_cast<size_t>(size) * size);
  for (int r = 0; r < size; ++r) comms_.push_back(std::make_unique<LocalCommunicator>(*this, r));
}

LocalGroup::~LocalGroup() = default;

Communicator& LocalGroup::rank(int r) {
  TESSERA_CHECK(r >= 0 && r < size_, "local communicator group: rank ", r, " of a group of ", size_);
  return *comms_[r];
}

void LocalGroup::abort(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_.empty()) aborted_ = why.empty() ? "aborted" : why;
  cv_.notify_all();
}

void LocalGroup::reset() {
  std::lock_guard<std::mutex> lock(mu_);
  aborted_.clear();
  error_.clear();
  arrived_ = 0;  // ranks that posted before the abort left without completing the collective
  ++generation_;
  for (auto& box : mail_) box.clear();
}

void LocalGroup::post(int from, int to, const float* data, int64_t n) {
  std::vector<float> message(data, data + n);  // copied outside the lock
  std::lock_guard<std::mutex> lock(mu_);
  if (!aborted_.empty()) fail("communicator group aborted: ", aborted_);
  mail_[static_cast<size_t>(from) * size_ + to].push_back(std::move(message));
  cv_.notify_all();
}

void LocalGroup::take(int from, int to, float* data, int64_t n) {
  std::unique_lock<std::mutex> lock(mu_);
  auto& box = mail_[static_cast<size_t>(from) * size_ + to];
  cv_.wait(lock, [&] { return !box.empty() || !aborted_.empty(); });
  if (!aborted_.empty()) fail("communicator group aborted: ", aborted_);
  std::vector<float> message = std::move(box.front());
  box.pop_front();
  lock.unlock();
  TESSERA_CHECK(static_cast<int64_t>(message.size()) == n, "recv: rank ", to, " expected ", n, " elements from rank ",
                from, ", which sent ", message.size());
  if (n > 0) std::memcpy(data, message.data(), sizeof(float) * static_cast<size_t>(n));
}

void LocalGroup::arrive(const std::function<void()>& last) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!aborted_.empty()) fail("communicator group aborted: ", aborted_);
  const uint64_t gen = generation_;
  if (++arrived_ == size_) {
    if (last) last();
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return;
  }
  cv_.wait(lock, [&] { return generation_ != gen || !aborted_.empty(); });
  if (generation_ == gen) fail("communicator group aborted: ", aborted_);
}

std::string LocalGroup::mismatch() const {
  const Post& p0 = posts_[0];
  for (int r = 1; r < size_; ++r) {
    const Post& p = posts_[r];
    std::ostringstream why;
    if (p.op != p0.op)
      why << "rank " << r << " called " << op_name(static_cast<int>(p.op)) << " while rank 0 called "
          << op_name(static_cast<int>(p0.op));
    else if (p.n != p0.n)
      why << op_name(static_cast<int>(p.op)) << ": rank " << r << " passed " << p.n
          << (p.op == Op::Broadcast ? " bytes" : " elements") << ", rank 0 passed " << p0.n;
    else if (p.root != p0.root)
      why << "broadcast: rank " << r << " names root " << p.root << ", rank 0 names root " << p0.root;
    if (!why.str().empty()) return why.str();
  }
  return "";
}

void LocalGroup::enter(int rank, const Post& p) {
  posts_[rank] = p;  // read by the others only after the barrier below (its mutex orders it)
  arrive([&] {
    error_ = mismatch();
    if (error_.empty() && p.op == Op::AllReduce && scratch_.size() < static_cast<size_t>(p.n))
      scratch_.resize(static_cast<size_t>(p.n));
  });
  // Every rank read the same posts, so every rank throws the same error (and none waits).
  if (!error_.empty()) fail("communicator: ", error_);
}

}  // namespace tessera
