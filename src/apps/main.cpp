// tessera: run and serve large language models on CPUs and GPUs.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "apps/commands.h"
#include "apps/common.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"tessera: run and serve large language models"};
  app.require_subcommand(1);
  tessera::apps::add_generate(app);
  tessera::apps::add_tokenize(app);
  tessera::apps::add_info(app);
  tessera::apps::add_eval(app);
  tessera::apps::add_bench(app);
  tessera::apps::add_serve(app);
  tessera::apps::add_kv_plan(app);
  tessera::apps::add_calibrate_kv(app);
  tessera::apps::add_quantize(app);
  try {
    std::vector<std::string> args = tessera::apps::expand_short_aliases(argc, argv);
    std::vector<char*> arg_ptrs;
    for (std::string& a : args) arg_ptrs.push_back(a.data());
    app.parse(static_cast<int>(arg_ptrs.size()), arg_ptrs.data());
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const tessera::Error& e) {
    std::fprintf(stderr, "tessera: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tessera: internal error: %s\n", e.what());
    return 2;
  }
  return 0;
}
