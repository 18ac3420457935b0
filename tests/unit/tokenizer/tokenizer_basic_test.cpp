#include <gtest/gtest.h>

#include "tokenizer/tokenizer.h"

using namespace tessera;

TEST(TokenizerBasic, Builds) { SUCCEED(); }
