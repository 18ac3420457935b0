// API keys: bearer parsing, tenants and salts derived from the key, key files.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "core/error.h"
#include "server/api/auth.h"

using namespace tessera::api;

TEST(ApiAuth, Sha256MatchesKnownVector) {
  // FIPS 180-2 test vector.
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(ApiAuth, NoKeysMeansAnonymous) {
  const ApiKeys keys;
  const auto t = keys.authenticate(std::nullopt);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->name, "");
  EXPECT_EQ(t->salt, "");
}

TEST(ApiAuth, BearerKeysGiveDistinctTenants) {
  const ApiKeys keys({"sk-alpha", "sk-beta"});
  EXPECT_FALSE(keys.authenticate(std::nullopt));
  EXPECT_FALSE(keys.authenticate("sk-alpha"));  // no scheme
  EXPECT_FALSE(keys.authenticate("Basic sk-alpha"));
  EXPECT_FALSE(keys.authenticate("Bearer sk-alph"));
  EXPECT_FALSE(keys.authenticate("Bearer sk-alphaX"));
  EXPECT_FALSE(keys.authenticate("Bearer "));
  EXPECT_FALSE(keys.authenticate("Bearersk-alpha"));
  EXPECT_FALSE(keys.authenticate("Bear sk-alpha"));
  // The scheme is case-insensitive (RFC 9110 11.1), and spaces may separate it from the key.
  for (const char* v : {"bearer sk-alpha", "BEARER sk-alpha", "bEaReR  sk-alpha", "Bearer\tsk-alpha"}) {
    const auto t = keys.authenticate(v);
    ASSERT_TRUE(t) << v;
    EXPECT_EQ(t->salt, sha256_hex("sk-alpha")) << v;
  }
  const auto a = keys.authenticate("Bearer sk-alpha");
  const auto b = keys.authenticate("Bearer sk-beta");
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->salt, sha256_hex("sk-alpha"));
  EXPECT_EQ(b->salt, sha256_hex("sk-beta"));
  EXPECT_EQ(a->name, "key-" + sha256_hex("sk-alpha").substr(0, 12));
  EXPECT_NE(a->name, b->name);
  EXPECT_NE(a->salt, b->salt);
}

TEST(ApiAuth, KeyFileSkipsBlankAndCommentLines) {
  const std::string path = ::testing::TempDir() + "/tessera_keys.txt";
  {
    std::ofstream out(path);
    out << "# keys\n\n  sk-one  \nsk-two\r\n";
  }
  EXPECT_EQ(ApiKeys::read_key_file(path), (std::vector<std::string>{"sk-one", "sk-two"}));
  std::remove(path.c_str());
  EXPECT_THROW(ApiKeys::read_key_file(path), tessera::Error);
  EXPECT_THROW(ApiKeys({""}), tessera::Error);
}
