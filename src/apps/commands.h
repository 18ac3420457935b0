#pragma once
// The subcommands of the `tessera` command line, each in its own file.
#include <CLI/CLI.hpp>

namespace tessera::apps {

// Each add_* registers a subcommand on the app and sets its callback.
void add_generate(CLI::App& app);
void add_tokenize(CLI::App& app);
void add_info(CLI::App& app);
void add_eval(CLI::App& app);
void add_bench(CLI::App& app);
void add_serve(CLI::App& app);
void add_kv_plan(CLI::App& app);
void add_calibrate_kv(CLI::App& app);
void add_quantize(CLI::App& app);
// Subcommands of `tessera bench` (registered by add_bench).
void add_bench_serve(CLI::App& bench);
void add_bench_compare(CLI::App& bench);
void add_bench_grammar(CLI::App& bench);
void add_bench_verify(CLI::App& bench);
void add_bench_kv_transfer(CLI::App& bench);

}  // namespace tessera::apps
