#pragma once
// What build this is: tessera's release version and the git commit it was configured from
// (CMake reads `git rev-parse` at configure time; "" when the tree was not a git checkout).
#include <string_view>

namespace tessera {

std::string_view version();     // "0.1.0"
std::string_view git_commit();  // "2db5e20c..." or "" when unknown

}  // namespace tessera
