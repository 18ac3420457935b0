// The context limit end to end on a dummy Llama 3 shape (trained context 131,072): the
// default reaches the scheduler uncapped, an explicit one reaches it as given, a KV pool
// that cannot hold one sequence refuses to start naming what fits and which flag to change,
// and a request over the limit is refused naming both numbers. Also the start-up summary.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "engine/engine_core.h"
#include "engine/engine_model.h"
#include "engine/engine_summary.h"

using namespace tessera;

namespace {

ModelEngineOptions tiny_llama3(int max_model_len, int64_t kv_bytes) {
  ModelEngineOptions o;
  o.session.model = "dummy:llama3-tiny";
  o.session.backend.threads = 1;
  o.scheduler.max_num_batched_tokens = 64;
  o.scheduler.max_num_seqs = 4;
  o.scheduler.max_model_len = max_model_len;
  o.kv_cache_bytes = kv_bytes;
  o.warmup = false;
  return o;
}

Request request_of(int n_prompt, int max_tokens) {
  Request r;
  r.prompt.assign(n_prompt, 3);
  r.sampling.max_tokens = max_tokens;
  r.sampling.temperature = 0;
  return r;
}

// llama3-tiny: 3 layers x 2 KV heads x 128 x (K, V) x f16 = 3 KiB of KV per token.
constexpr int64_t kKvBytesPerToken = 3 * 2 * 128 * 2 * 2;

}  // namespace

TEST(EngineLimits, DefaultIsTheTrainedContextUncapped) {
  ModelEngine m(tiny_llama3(0, 131072 * kKvBytesPerToken));
  EXPECT_EQ(m.config().scheduler.max_model_len, 131072);
  EXPECT_GE(static_cast<int64_t>(m.config().n_blocks) * m.config().block_size, 131071);
}

TEST(EngineLimits, AnExplicitLimitReachesTheSchedulerAndAdmission) {
  ModelEngine m(tiny_llama3(16384, 20000 * kKvBytesPerToken));
  EXPECT_EQ(m.config().scheduler.max_model_len, 16384);
  EngineCore core(m.config(), m.executor());
  // The case: 8000 + 128 tokens in a 16,384-token context.
  EXPECT_FALSE(core.validate(request_of(8000, 128)).has_value());
  const auto over = core.validate(request_of(16000, 1000));
  ASSERT_TRUE(over.has_value());
  EXPECT_EQ(over->reason, RejectReason::InvalidRequest);
  EXPECT_NE(over->message.find("17000"), std::string::npos) << over->message;
  EXPECT_NE(over->message.find("16384"), std::string::npos) << over->message;
}

TEST(EngineLimits, APoolThatCannotHoldOneSequenceRefusesToStart) {
  // 1,000 tokens of KV for a 131,072-token context.
  try {
    ModelEngine m(tiny_llama3(0, 1000 * kKvBytesPerToken));
    ADD_FAILURE() << "started with a KV pool smaller than one sequence";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("holds 992 tokens"), std::string::npos) << msg;  // 62 blocks of 16
    EXPECT_NE(msg.find("--max-model-len 131072"), std::string::npos) << msg;
    EXPECT_NE(msg.find("lower --max-model-len to at most 993"), std::string::npos) << msg;
    EXPECT_NE(msg.find("--kv-cache-memory"), std::string::npos) << msg;
  }
}

TEST(EngineLimits, ALimitOverTheTrainedContextIsRefused) {
  try {
    ModelEngine m(tiny_llama3(131073, 64ll << 20));
    ADD_FAILURE() << "started past the trained context";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("trained context of 131072"), std::string::npos) << e.what();
  }
}

TEST(EngineLimits, PriorityIsRefusedUnderFcfsAndTakenUnderPriority) {
  ModelEngineOptions o = tiny_llama3(256, 4ll << 20);
  Request r = request_of(4, 4);
  r.priority = 3;
  {
    ModelEngine m(o);
    EngineCore core(m.config(), m.executor());
    const auto v = core.validate(r);
    ASSERT_TRUE(v.has_value());
    EXPECT_NE(v->message.find("--scheduling-policy priority"), std::string::npos) << v->message;
  }
  o.scheduler.policy = SchedulingPolicy::Priority;
  ModelEngine m(o);
  EngineCore core(m.config(), m.executor());
  EXPECT_FALSE(core.validate(r).has_value());
}

TEST(EngineSummary, DescribesTheLoadedEngine) {
  ModelEngineOptions o = tiny_llama3(4096, 4096 * kKvBytesPerToken);
  o.scheduler.policy = SchedulingPolicy::Priority;
  ModelEngine m(o);
  const EngineSummary s = describe_engine(m, "dummy:llama3-tiny");
  EXPECT_EQ(s.architecture, "llama");
  EXPECT_EQ(s.max_model_len, 4096);
  EXPECT_EQ(s.trained_context, 131072);
  EXPECT_EQ(s.kv_tokens(), 4096);
  EXPECT_EQ(s.kv_dtype, "f16");
  EXPECT_EQ(s.policy, "priority");
  EXPECT_EQ(s.preemption, "recompute");
  EXPECT_NE(s.device.find("cpu"), std::string::npos) << s.device;
}

TEST(EngineSummary, FormatsOneLinePerTopic) {
  EngineSummary s;
  s.model = "dummy:llama-3.1-8b";
  s.name = "dummy llama-3.1-8b";
  s.architecture = "llama";
  s.n_params = 8'030'261'248;
  s.trained_context = 131072;
  s.max_model_len = 16384;
  s.kv_dtype = "f16";
  s.block_size = 16;
  s.n_blocks = 4096;
  s.kv_block_bytes = 2 << 20;  // 128 KiB per token
  s.kv_bytes = s.kv_block_bytes * s.n_blocks;
  s.device = "cuda: NVIDIA H200";
  s.max_num_seqs = 32;
  s.max_num_batched_tokens = 512;
  s.max_partial_prefills = 4;
  s.policy = "fcfs";
  s.preemption = "recompute";
  s.prefix_caching = true;
  const std::string text = format_engine_summary(s);
  EXPECT_NE(text.find("tessera: model       dummy llama-3.1-8b (llama, 8.03B parameters) from dummy:llama-3.1-8b\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("max 16384 tokens per sequence (--max-model-len; trained 131072)"), std::string::npos) << text;
  EXPECT_NE(text.find("f16 (16.00 bits/element), 4096 blocks of 16 tokens = 65536 tokens (8.00 GiB); 4.00 sequences of "
                      "16384 tokens"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("tessera: device      cuda: NVIDIA H200\n"), std::string::npos) << text;
  EXPECT_NE(text.find("policy fcfs, 32 sequences and 512 tokens per step"), std::string::npos) << text;
  EXPECT_EQ(text.find("swap space"), std::string::npos) << text;  // no host tier
  s.n_host_blocks = 2048;
  EXPECT_NE(format_engine_summary(s).find("tessera: swap space  2048 host blocks (4.00 GiB)"), std::string::npos);
  EXPECT_EQ(text.find("KV windows"), std::string::npos) << text;  // no local pool
  s.window = 512;
  s.n_local_layers = 5;
  s.n_layers = 6;
  s.n_local_blocks = 2000;
  s.unwindowed_tokens = 20000;
  EXPECT_NE(format_engine_summary(s).find(
                "tessera: KV windows  5 of 6 layers keep a 512-token window in a pool of "
                "2000 blocks; without it the same memory holds 20000 tokens (the windows hold 3.28x as many)"),
            std::string::npos)
      << format_engine_summary(s);
}

TEST(EngineSummary, HumanUnits) {
  EXPECT_EQ(human_bytes_binary(100), "100 B");
  EXPECT_EQ(human_bytes_binary(1536), "1.50 KiB");
  EXPECT_EQ(human_bytes_binary(3ll << 30), "3.00 GiB");
  EXPECT_EQ(human_count(134'515'008), "135M");
  EXPECT_EQ(human_count(999), "999");
}
