#include "core/version.h"

// Set on this file alone by CMakeLists.txt, so a new commit recompiles only this file.
#ifndef TESSERA_VERSION
#define TESSERA_VERSION "0.0.0"
#endif
#ifndef TESSERA_GIT_COMMIT
#define TESSERA_GIT_COMMIT ""
#endif

namespace tessera {

std::string_view version() { return TESSERA_VERSION; }
std::string_view git_commit() { return TESSERA_GIT_COMMIT; }

}  // namespace tessera
