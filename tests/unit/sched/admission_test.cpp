// Admission control alone: waiting-queue bounds, per-tenant request and token limits,
// typed rejections naming the numbers, and exact release of what was counted.
#include "sched/admission.h"

#include <gtest/gtest.h>

#include "core/error.h"

using namespace tessera;

namespace {
std::string message(const std::optional<Rejection>& r) { return r ? r->message : std::string("admitted"); }
}  // namespace

TEST(Admission, PerTenantTokenLimitCountsPromptPlusMaxTokensTimesN) {
  AdmissionControl a({.max_waiting_requests = 100,
                      .max_waiting_tokens = 1 << 20,
                      .max_requests_per_tenant = 0,
                      .max_tokens_per_tenant = 1000});
  // prompt 100 + max_tokens 200 x n 2 = 500 tokens each.
  EXPECT_FALSE(a.admit("acme", 100, 500));
  EXPECT_FALSE(a.admit("acme", 100, 500));
  EXPECT_EQ(a.tokens_in_flight("acme"), 1000);
  const auto third = a.admit("acme", 10, 20);
  ASSERT_TRUE(third);
  EXPECT_EQ(third->reason, RejectReason::TenantLimit);
  EXPECT_EQ(http_status(third->reason), 429);
  for (const char* number : {"1000 tokens in flight", "+ 20", "limit of 1000"})
    EXPECT_NE(third->message.find(number), std::string::npos) << message(third);
  EXPECT_FALSE(a.admit("other", 10, 20)) << "tenants are counted apart";
  EXPECT_EQ(a.waiting_requests(), 3);  // the refusal counted nothing

  // One started and finished: its tokens are released, room again.
  a.started(100);
  a.finished("acme", true, 100, 500);
  EXPECT_EQ(a.tokens_in_flight("acme"), 500);
  EXPECT_FALSE(a.admit("acme", 10, 20));
  EXPECT_EQ(a.tokens_in_flight("acme"), 520);

  // Over the limit on its own: never admissible, so invalid (400), not a retry (429).
  const auto huge = a.admit("fresh", 1, 1001);
  ASSERT_TRUE(huge);
  EXPECT_EQ(huge->reason, RejectReason::InvalidRequest);
  EXPECT_NE(huge->message.find("1001"), std::string::npos) << message(huge);
  EXPECT_EQ(a.tokens_in_flight("fresh"), 0);

  a.finished("acme", false, 100, 500);
  a.finished("acme", false, 10, 20);
  a.finished("other", false, 10, 20);
  EXPECT_EQ(a.tokens_in_flight("acme"), 0);
  EXPECT_EQ(a.in_flight("acme"), 0);
  EXPECT_EQ(a.waiting_requests(), 0);
  EXPECT_EQ(a.waiting_tokens(), 0);
}

TEST(Admission, RequestAndTokenLimitsTogether) {
  AdmissionControl a({.max_waiting_requests = 100,
                      .max_waiting_tokens = 1 << 20,
                      .max_requests_per_tenant = 2,
                      .max_tokens_per_tenant = 100});
  EXPECT_FALSE(a.admit("t", 5, 10));
  EXPECT_FALSE(a.admit("t", 5, 10));
  const auto by_count = a.admit("t", 5, 10);
  ASSERT_TRUE(by_count);
  EXPECT_EQ(by_count->reason, RejectReason::TenantLimit);
  EXPECT_NE(by_count->message.find("2 sequences in flight + 1 for this request exceed the limit of 2"),
            std::string::npos)
      << message(by_count);
  a.finished("t", false, 5, 10);
  const auto by_tokens = a.admit("t", 5, 95);  // 10 + 95 > 100
  ASSERT_TRUE(by_tokens);
  EXPECT_EQ(by_tokens->reason, RejectReason::TenantLimit);
  EXPECT_FALSE(a.admit("t", 5, 90));  // 10 + 90 = 100: exactly at the limit
  // Releasing more than was counted is a bug.
  EXPECT_THROW(a.finished("t", false, 5, 1000), Error);
}

TEST(Admission, TenantLimitCountsSequencesNotRequests) {
  AdmissionControl a({.max_waiting_requests = 100,
                      .max_waiting_tokens = 1 << 20,
                      .max_requests_per_tenant = 4,
                      .max_tokens_per_tenant = 0});
  EXPECT_FALSE(a.admit("t", 5, 10, 3));  // n = 3
  EXPECT_EQ(a.in_flight("t"), 3);
  const auto over = a.admit("t", 5, 10, 2);  // 3 + 2 > 4
  ASSERT_TRUE(over);
  EXPECT_EQ(over->reason, RejectReason::TenantLimit);
  EXPECT_FALSE(a.admit("t", 5, 10, 1));  // 3 + 1 = 4: at the limit
  // More choices than the limit could ever hold: invalid, not "retry later".
  const auto never = a.admit("u", 5, 10, 5);
  ASSERT_TRUE(never);
  EXPECT_EQ(never->reason, RejectReason::InvalidRequest);
  EXPECT_EQ(a.in_flight("u"), 0);
  a.finished("t", false, 5, 10, 3);
  EXPECT_EQ(a.in_flight("t"), 1);
  EXPECT_THROW(a.finished("t", false, 5, 10, 2), Error);  // releasing more than was counted
  a.finished("t", false, 5, 10, 1);
  EXPECT_EQ(a.in_flight("t"), 0);
}

TEST(Admission, NoTokenLimitByDefault) {
  AdmissionControl a(AdmissionLimits{});
  EXPECT_FALSE(a.admit("t", 1000, 1 << 30));
  a.finished("t", false, 1000, 1 << 30);
  EXPECT_EQ(a.in_flight("t"), 0);
}
