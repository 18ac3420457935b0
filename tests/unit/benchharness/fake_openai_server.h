#pragma once
// A fake OpenAI-compatible streaming server for the harness tests: 127.0.0.1 on a free port,
// one thread per connection (fine for a test), chunks sent at exact absolute times with
// sleep_until (first text chunk at receipt + ttft, then every itl), so the client's timing
// can be checked against known delays. Also answers POST /tokenize by counting words.
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "benchharness/prompt_text.h"

namespace tessera::bench::testing {

struct FakeServerConfig {
  std::chrono::microseconds ttft{50000};
  std::chrono::microseconds itl{10000};
  int fail_status = 0;  // != 0: answer every completion request with this status
  std::string fail_message = "injected failure";
  bool send_usage = true;
  std::string reply_word = "tok";
  bool tokenize = true;  // false: POST /tokenize answers 404
};

class FakeOpenAIServer {
 public:
  explicit FakeOpenAIServer(FakeServerConfig config) : config_(std::move(config)), acceptor_(io_) {
    using boost::asio::ip::tcp;
    tcp::endpoint ep(boost::asio::ip::make_address("127.0.0.1"), 0);
    acceptor_.open(ep.protocol());
    acceptor_.set_option(tcp::acceptor::reuse_address(true));
    acceptor_.bind(ep);
    acceptor_.listen();
    port_ = acceptor_.local_endpoint().port();
    accept_thread_ = std::thread([this] { accept_loop(); });
  }

  ~FakeOpenAIServer() {
    stopping_ = true;
    // A blocking accept() is not woken by close() on Linux: connect once to release it.
    {
      boost::asio::io_context io;
      boost::asio::ip::tcp::socket wake(io);
      boost::system::error_code ec;
      wake.connect({boost::asio::ip::make_address("127.0.0.1"), port_}, ec);
    }
    accept_thread_.join();
    boost::system::error_code ec;
    acceptor_.close(ec);
    std::lock_guard lock(mu_);
    for (auto& t : workers_) t.join();
  }

  std::string base_url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int max_concurrent() const { return max_active_.load(); }
  std::vector<nlohmann::json> bodies() const {
    std::lock_guard lock(mu_);
    return bodies_;
  }
  // The delays the server actually produced (ms): connection accepted → first text chunk written,
  // and between text chunks. On a loaded machine sleep_until overshoots; tests compare the
  // harness against these as well as against the injected values.
  std::vector<double> realized_ttft_ms() const {
    std::lock_guard lock(mu_);
    return realized_ttft_ms_;
  }
  std::vector<double> realized_itl_ms() const {
    std::lock_guard lock(mu_);
    return realized_itl_ms_;
  }

  // Words separated by single spaces: the fake tokenizer of the fake server.
  static int64_t count_words(const std::string& s) {
    int64_t n = 0;
    bool in_word = false;
    for (char c : s) {
      if (c == ' ')
        in_word = false;
      else if (!in_word)
        in_word = true, ++n;
    }
    return n;
  }

 private:
  void accept_loop() {
    for (;;) {
      boost::system::error_code ec;
      boost::asio::ip::tcp::socket sock(io_);
      acceptor_.accept(sock, ec);
      // Delays count from the accept, so the worker thread's start-up (slow on a loaded
      // machine) is inside the injected TTFT instead of added to it.
      const auto accepted = std::chrono::steady_clock::now();
      if (ec || stopping_) return;
      std::lock_guard lock(mu_);
      workers_.emplace_back([this, accepted, s = std::move(sock)]() mutable { serve(std::move(s), accepted); });
    }
  }

  void serve(boost::asio::ip::tcp::socket sock, std::chrono::steady_clock::time_point t0) {
    namespace http = boost::beast::http;
    namespace net = boost::asio;
    boost::system::error_code ec;
    boost::beast::flat_buffer buf;
    http::request<http::string_body> req;
    http::read(sock, buf, req, ec);
    if (!ec) handle(sock, req, t0);
    sock.shutdown(net::ip::tcp::socket::shutdown_both, ec);
  }

  // A request counts as active from when it has been read until just before the last bytes of
  // its response are written, so the client (which needs those bytes to finish) can never
  // start a follow-up request that overlaps it in this count.
  void enter() {
    const int active = ++active_;
    for (int m = max_active_.load(); active > m && !max_active_.compare_exchange_weak(m, active);) {
    }
  }
  void leave() { --active_; }

  void respond(boost::asio::ip::tcp::socket& sock, int status, const nlohmann::json& body) {
    namespace http = boost::beast::http;
    http::response<http::string_body> res{static_cast<http::status>(status), 11};
    res.set(http::field::content_type, "application/json");
    res.body() = body.dump();
    res.prepare_payload();
    boost::system::error_code ec;
    http::write(sock, res, ec);
  }

  void handle(boost::asio::ip::tcp::socket& sock,
              const boost::beast::http::request<boost::beast::http::string_body>& req,
              std::chrono::steady_clock::time_point t0) {
    namespace http = boost::beast::http;
    namespace net = boost::asio;
    const auto body = nlohmann::json::parse(req.body(), nullptr, false);
    enter();
    if (req.target() == "/tokenize") {
      leave();
      if (!config_.tokenize) {
        respond(sock, 404, {{"detail", "Not Found"}});
        return;
      }
      const int64_t n = count_words(body.value("prompt", std::string()));
      respond(sock, 200, {{"count", n}, {"tokens", std::vector<int>(n, 7)}});
      return;
    }
    {
      std::lock_guard lock(mu_);
      bodies_.push_back(body);
    }
    if (config_.fail_status != 0) {
      leave();
      respond(sock, config_.fail_status, {{"error", {{"message", config_.fail_message}, {"type", "server_error"}}}});
      return;
    }
    const bool chat = req.target() == "/v1/chat/completions";
    const int n = body.value("max_tokens", 16);
    http::response<http::empty_body> res{http::status::ok, 11};
    res.set(http::field::content_type, "text/event-stream");
    res.chunked(true);
    http::response_serializer<http::empty_body> sr{res};
    boost::system::error_code ec;
    http::write_header(sock, sr, ec);
    auto send = [&](const std::string& data) {
      const std::string event = "data: " + data + "\n\n";
      net::write(sock, http::make_chunk(net::buffer(event)), ec);
    };
    // A role-only chunk at once: first byte, but no text yet (must not count as TTFT).
    if (chat) send(R"({"choices":[{"index":0,"delta":{"role":"assistant"}}]})");
    std::vector<double> ttft, itl;
    auto last = t0;
    for (int k = 0; k < n && !ec; ++k) {
      std::this_thread::sleep_until(t0 + config_.ttft + k * config_.itl);
      const auto now = std::chrono::steady_clock::now();
      (k == 0 ? ttft : itl).push_back(std::chrono::duration<double, std::milli>(now - (k == 0 ? t0 : last)).count());
      last = now;
      nlohmann::json chunk;
      const std::string text = config_.reply_word + " ";
      if (chat)
        chunk = {{"choices", {{{"index", 0}, {"delta", {{"content", text}}}}}}};
      else
        chunk = {{"choices", {{{"index", 0}, {"text", text}}}}};
      if (k == n - 1) chunk["choices"][0]["finish_reason"] = "length";
      send(chunk.dump());
    }
    {
      std::lock_guard lock(mu_);
      realized_ttft_ms_.insert(realized_ttft_ms_.end(), ttft.begin(), ttft.end());
      realized_itl_ms_.insert(realized_itl_ms_.end(), itl.begin(), itl.end());
    }
    if (config_.send_usage) {
      int64_t prompt = 0;
      if (chat)
        for (const auto& m : body["messages"]) prompt += count_words(m["content"].get<std::string>());
      else
        prompt = count_words(body.value("prompt", std::string()));
      send(nlohmann::json{{"choices", nlohmann::json::array()},
                          {"usage", {{"prompt_tokens", prompt}, {"completion_tokens", n}}},
                          {"timings", {{"queue_ms", 1.5}}}}
               .dump());
    }
    leave();
    send("[DONE]");
    net::write(sock, http::make_chunk_last(), ec);
  }

  FakeServerConfig config_;
  boost::asio::io_context io_;
  boost::asio::ip::tcp::acceptor acceptor_;
  uint16_t port_ = 0;
  std::thread accept_thread_;
  mutable std::mutex mu_;
  std::vector<std::thread> workers_;
  std::vector<nlohmann::json> bodies_;
  std::vector<double> realized_ttft_ms_, realized_itl_ms_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> active_{0}, max_active_{0};
};

// The word-counting tokenizer in process (for prompt tests without a model).
class WordCounter : public TokenCounter {
 public:
  int64_t count(std::string_view text) override { return FakeOpenAIServer::count_words(std::string(text)); }
  std::string describe() const override { return "word counter"; }
};

}  // namespace tessera::bench::testing
