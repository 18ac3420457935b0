// The in-process communicator group against sequential host math, and the TCP rendezvous on
// localhost with ranks as threads.
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "parallel/local_comm.h"
#include "parallel/rendezvous.h"

using namespace tessera;

namespace {

// Runs f(rank) on `size` threads; returns each rank's exception text ("" when none).
template <typename F>
std::vector<std::string> on_ranks(int size, F f) {
  std::vector<std::string> errors(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      try {
        f(r);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

float value(int rank, int64_t i) { return 0.1f * static_cast<float>((i * 7 + rank * 13) % 101) - 3.3f / (rank + 1); }

}  // namespace

TEST(LocalComm, AllReduceIsTheRankOrderSumOnEveryRankEveryRun) {
  for (int size : {1, 2, 3, 4}) {
    const int64_t n = 1001;  // not a multiple of the size: uneven chunks
    std::vector<float> expect(n);
    for (int64_t i = 0; i < n; ++i) {
      float s = value(0, i);
      for (int r = 1; r < size; ++r) s += value(r, i);  // rank order, float32, as the contract says
      expect[i] = s;
    }
    LocalGroup g(size);
    for (int run = 0; run < 3; ++run) {
      std::vector<std::vector<float>> out(size, std::vector<float>(n));
      auto errors = on_ranks(size, [&](int r) {
        for (int64_t i = 0; i < n; ++i) out[r][i] = value(r, i);
        g.rank(r).all_reduce_sum(out[r].data(), n);
        g.rank(r).all_reduce_sum(out[r].data(), 0);  // empty is fine
      });
      for (int r = 0; r < size; ++r) {
        EXPECT_EQ(errors[r], "");
        EXPECT_EQ(std::memcmp(out[r].data(), expect.data(), sizeof(float) * n), 0) << "size " << size << " rank " << r;
      }
    }
  }
}

TEST(LocalComm, AllGatherBroadcastBarrier) {
  const int size = 3, n = 5;
  LocalGroup g(size);
  std::vector<std::vector<float>> recv(size, std::vector<float>(size * n));
  std::vector<std::vector<int>> bc(size, std::vector<int>(4, -1));
  auto errors = on_ranks(size, [&](int r) {
    std::vector<float> send(n);
    for (int i = 0; i < n; ++i) send[i] = value(r, i);
    g.rank(r).all_gather(send.data(), recv[r].data(), n);
    if (r == 1) bc[r] = {7, 8, 9, 10};
    g.rank(r).broadcast(bc[r].data(), sizeof(int) * 4, 1);
    g.rank(r).barrier();
    // in place: send is this rank's own slot of recv
    for (int i = 0; i < n; ++i) recv[r][r * n + i] += 1;
    g.rank(r).all_gather(recv[r].data() + r * n, recv[r].data(), n);
  });
  for (int r = 0; r < size; ++r) {
    EXPECT_EQ(errors[r], "");
    for (int q = 0; q < size; ++q)
      for (int i = 0; i < n; ++i) EXPECT_EQ(recv[r][q * n + i], value(q, i) + 1);
    EXPECT_EQ(bc[r], (std::vector<int>{7, 8, 9, 10}));
  }
}

TEST(LocalComm, MismatchedCallsFailOnEveryRankNamingTheSizes) {
  LocalGroup g(2);
  auto errors = on_ranks(2, [&](int r) {
    std::vector<float> v(12);
    g.rank(r).all_reduce_sum(v.data(), r == 0 ? 12 : 10);
  });
  for (const auto& e : errors)
    EXPECT_NE(e.find("all_reduce_sum: rank 1 passed 10 elements, rank 0 passed 12"), std::string::npos) << e;
  // the group still works after a mismatch every rank saw
  errors = on_ranks(2, [&](int r) {
    std::vector<float> v(3, 1.0f);
    if (r == 0)
      g.rank(r).all_reduce_sum(v.data(), 3);
    else
      g.rank(r).all_gather(v.data(), v.data(), 1);
  });
  for (const auto& e : errors)
    EXPECT_NE(e.find("rank 1 called all_gather while rank 0 called all_reduce_sum"), std::string::npos) << e;
  errors = on_ranks(2, [&](int r) {
    int x = r;
    g.rank(r).broadcast(&x, sizeof(x), r);
  });
  for (const auto& e : errors) EXPECT_NE(e.find("rank 1 names root 1, rank 0 names root 0"), std::string::npos) << e;
  EXPECT_THROW(g.rank(2), Error);
  EXPECT_THROW(LocalGroup(0), Error);
}

TEST(LocalComm, AbortWakesTheRanksThatWait) {
  LocalGroup g(3);
  auto errors = on_ranks(3, [&](int r) {
    if (r == 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      g.abort("rank 2 failed: out of memory");
      return;
    }
    float v = 1;
    g.rank(r).all_reduce_sum(&v, 1);
  });
  EXPECT_NE(errors[0].find("rank 2 failed: out of memory"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("rank 2 failed: out of memory"), std::string::npos) << errors[1];
}

namespace {
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}
}  // namespace

TEST(Rendezvous, RankZeroHandsItsBlobToEveryRankOfEveryNode) {
  // 2 nodes of 2 ranks on one host: global ranks 0..3
  const int port = free_port();
  const std::string blob(128, '\x5a');
  std::vector<std::string> got(4);
  auto errors = on_ranks(4, [&](int g) {
    RendezvousOptions o;
    o.master_port = port;
    o.nnodes = 2;
    o.node_rank = g / 2;
    o.ranks_per_node = 2;
    o.local_rank = g % 2;
    o.timeout_s = 20;
    got[g] = rendezvous_broadcast(o, g == 0 ? blob : std::string("ignored"));
  });
  for (int g = 0; g < 4; ++g) {
    EXPECT_EQ(errors[g], "");
    EXPECT_EQ(got[g], blob) << "rank " << g;
  }
}

TEST(Rendezvous, BadWorldsAndTimeoutsAreNamed) {
  const int port = free_port();
  auto errors = on_ranks(2, [&](int g) {
    RendezvousOptions o;
    o.master_port = port;
    o.nnodes = g == 0 ? 2 : 3;  // the peer thinks there are 3 nodes
    o.node_rank = g;
    o.timeout_s = 5;
    rendezvous_broadcast(o, "id");
  });
  EXPECT_NE(errors[0].find("rank 1 says the world has 3 ranks, rank 0 says 2"), std::string::npos) << errors[0];
  RendezvousOptions lonely;
  lonely.master_port = free_port();
  lonely.nnodes = 3;
  lonely.timeout_s = 0.3;
  try {
    rendezvous_broadcast(lonely, "id");
    ADD_FAILURE() << "no timeout";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("waiting for rank(s) 1, 2 of 3"), std::string::npos) << e.what();
  }
  RendezvousOptions bad;
  bad.nnodes = 2;
  bad.node_rank = 2;
  EXPECT_THROW(rendezvous_broadcast(bad, ""), Error);
  bad = {};
  bad.master_port = 70000;
  EXPECT_THROW(rendezvous_broadcast(bad, ""), Error);
}
