#pragma once
// Errors in tessera are exceptions of one type, thrown where the problem is found with a
// message that names it, and caught at the boundary (command line, engine step, HTTP handler),
// which turns them into an exit code or an error response. Nothing below the boundary
// swallows them.
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace tessera {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// fail("tensor '", name, "' has ", n, " dims") — builds the message from its pieces.
template <typename... Parts>
[[noreturn]] void fail(Parts&&... parts) {
  std::ostringstream os;
  (os << ... << std::forward<Parts>(parts));
  throw Error(os.str());
}

#define TESSERA_CHECK(cond, ...)               \
  do {                                         \
    if (!(cond)) ::tessera::fail(__VA_ARGS__); \
  } while (0)

}  // namespace tessera
