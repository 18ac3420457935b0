// TESSERA_CUDA_DIAG, the CUDA backend's one diagnostic switch (backend/cuda/cuda_diag.h):
// its items parse, and anything else is refused with an error that names it.
#include <gtest/gtest.h>

#include "backend/cuda/cuda_diag.h"

using tessera::cuda::Diagnostics;
using tessera::cuda::parse_diagnostics;

TEST(CudaDiag, UnsetOrEmptyTurnsNothingOn) {
  for (const char* v : {static_cast<const char*>(nullptr), "", ",,"}) {
    const Diagnostics d = parse_diagnostics(v);
    EXPECT_FALSE(d.profile);
    EXPECT_TRUE(d.probe_file.empty());
  }
}

TEST(CudaDiag, ItemsParse) {
  EXPECT_TRUE(parse_diagnostics("profile").profile);
  const Diagnostics d = parse_diagnostics("probe=/tmp/run 1.txt,profile");
  EXPECT_TRUE(d.profile);
  EXPECT_EQ(d.probe_file, "/tmp/run 1.txt");
  EXPECT_FALSE(parse_diagnostics("probe=p").profile);
}

TEST(CudaDiag, UnknownItemsAreRefusedByName) {
  for (const char* bad : {"1", "profile,graphs=0", "probe=", "probe", "PROFILE"}) {
    try {
      parse_diagnostics(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const tessera::Error& e) {
      EXPECT_NE(std::string(e.what()).find("TESSERA_CUDA_DIAG: unknown item"), std::string::npos) << e.what();
    }
  }
  try {
    parse_diagnostics("profile,TESSERA_CUDA_PDL=0");
    ADD_FAILURE() << "accepted an old A/B switch";
  } catch (const tessera::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'TESSERA_CUDA_PDL=0'"), std::string::npos) << e.what();
  }
}
